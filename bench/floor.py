"""The raw boto3 floor: the two conditional UpdateItems of an acquire+release, by hand.

Same item layout and expressions as the engine's (so the server does the same work),
same botocore config, nothing else: no gates, no heartbeat, no Lease. Kept in step
with the engine's acquire and release requests; ``python -m bench`` checks on every
server that they still match (``floor_differences``). In the suite the floor is one
more contender (``bench.contenders.FLOOR``); ``bench.suite`` also times parts of its
expressions, and ``bench.moto_profile`` profiles moto on them.
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
import uuid
from typing import Any

from bench.clients import LEASE_DURATION, TABLE, make_client, raw_client
from django_dynlock.engine.items import EMPTY_RING, RING, release_slot, ring_index


class Floor:
    """The engine's acquire and release UpdateItems, sent raw (see the module's docstring)."""

    ACQUIRE_EXPRESSION = (
        "SET #owner = :me, #rvn = :rvn, #seq = :seq, #lease_ms = :lease_ms, #expires_at = :expires, "
        "#acquired_at = :now, #host = :host, #pid = :pid, #thread = :thread, #holder = :holder, "
        "#gc = :gc, #fence = if_not_exists(#fence, :base) + :one, #ring = if_not_exists(#ring, :ring0) "
        "REMOVE #released_at, #reserved_by"
    )
    # A free key, unless this acquisition was already released (the engine's guard
    # against a delayed duplicate of an acquire landing after its release) or another
    # waiter has reserved the next turn (and not let it lapse); our own earlier attempt;
    # or a holder whose expiry passed by DynamoDB's clock. The engine's steady state: a
    # client that knows DynamoDB's clock from an earlier reply.
    ACQUIRE_CONDITION = (
        "(attribute_not_exists(#owner) AND (attribute_not_exists(#slot) OR NOT contains(#slot, :tag))"
        " AND (attribute_not_exists(#ring) OR NOT contains(#ring, :tag))"
        " AND (attribute_not_exists(#reserved_by) OR #reserved_by = :me OR #released_at < :lapsed))"
        " OR (#owner = :me AND #seq < :seq) OR (attribute_exists(#owner) AND #expires_at < :earliest)"
    )
    RELEASE_EXPRESSION = (
        "SET #released_at = :now, #released_by = :me, #slot = :tag, #ring[{ring}] = :tag, #gc = :gc, #rvn = :rvn "
        "REMOVE #owner"
    )  # {ring}: the index of the lease's fence in the release ring (items.ring_index)
    RELEASE_CONDITION = "#owner = :me"

    def __init__(self, endpoint_url: str | None, client_config: Any):
        self.boto = raw_client(endpoint_url, client_config)
        self.host = socket.gethostname()
        self.pid = str(os.getpid())
        self.acquire_names = {
            f"#{n}": n
            for n in (
                "owner",
                "rvn",
                "seq",
                "fence",
                "lease_ms",
                "expires_at",
                "acquired_at",
                "host",
                "pid",
                "thread",
                "holder",
                "released_at",
                "reserved_by",
            )
        }
        self.acquire_names["#gc"] = "gc_at"
        self.acquire_names["#ring"] = RING
        self.release_names = {f"#{n}": n for n in ("owner", "rvn", "released_at", "released_by")}
        self.release_names["#gc"] = "gc_at"
        self.release_names["#ring"] = RING
        self.lease_ms = str(int(LEASE_DURATION * 1000))

    def acquire(self, key: str, condition: str | None = None, update: str | None = None) -> tuple[str, str]:
        """The engine's acquire; ``condition`` or ``update`` replace its expressions (to
        measure what a part of them costs the server)."""
        now = time.time()
        owner = uuid.uuid4().hex
        slot, tag = release_slot(owner)
        condition = condition or self.ACQUIRE_CONDITION
        update = update or self.ACQUIRE_EXPRESSION
        names, values = used_only(
            update + " " + condition,
            {**self.acquire_names, "#slot": slot},
            {
                ":tag": {"S": tag},
                ":lapsed": {"N": repr(round(now - 2.0, 6))},
                ":earliest": {"N": repr(round(now, 6))},
                ":me": {"S": owner},
                ":rvn": {"S": uuid.uuid4().hex},
                ":seq": {"N": "1"},
                ":lease_ms": {"N": self.lease_ms},
                ":expires": {"N": repr(round(now + LEASE_DURATION, 6))},
                ":now": {"N": repr(round(now, 6))},
                ":host": {"S": self.host},
                ":pid": {"N": self.pid},
                ":thread": {"S": "bench"},
                ":holder": {"M": {}},
                ":gc": {"N": str(int(now) + 3600)},
                ":base": {"N": str(int(now * 1_000_000))},
                ":one": {"N": "1"},
                ":ring0": EMPTY_RING,
            },
        )
        reply = self.boto.update_item(
            TableName=TABLE,
            Key={"key": {"S": key}},
            UpdateExpression=update,
            ConditionExpression=condition,
            ExpressionAttributeNames=names,
            ExpressionAttributeValues=values,
            ReturnValues="ALL_NEW",
            ReturnValuesOnConditionCheckFailure="ALL_OLD",
        )
        return owner, reply["Attributes"]["fence"]["N"]

    def release(self, key: str, owner: str, token: str) -> None:
        now = time.time()
        slot, tag = release_slot(owner)
        self.boto.update_item(
            TableName=TABLE,
            Key={"key": {"S": key}},
            UpdateExpression=self.RELEASE_EXPRESSION.format(ring=ring_index(int(token))),
            ConditionExpression=self.RELEASE_CONDITION,
            ExpressionAttributeNames={**self.release_names, "#slot": slot},
            ExpressionAttributeValues={
                ":me": {"S": owner},
                ":tag": {"S": tag},
                ":now": {"N": repr(round(now, 6))},
                ":rvn": {"S": uuid.uuid4().hex},
                ":gc": {"N": str(int(now) + 3600)},
            },
            ReturnValuesOnConditionCheckFailure="ALL_OLD",
        )

    def cycle(self, key: str) -> None:
        """One acquire+release of ``key``."""
        owner, token = self.acquire(key)
        self.release(key, owner, token)

    def close(self) -> None:
        self.boto.close()


def used_only(expressions: str, names: dict[str, str], values: dict[str, Any]) -> tuple[dict[str, str], dict[str, Any]]:
    """The names and values that ``expressions`` use: DynamoDB refuses unused ones."""
    used = set(re.findall(r"[#:][A-Za-z0-9_]+", expressions))
    return {k: v for k, v in names.items() if k in used}, {k: v for k, v in values.items() if k in used}


def floor_differences(endpoint_url: str) -> list[str]:
    """Differences between the engine's acquire/release requests and the floor's (empty: same)."""
    client = make_client(endpoint_url)
    seen: list[dict[str, Any]] = []

    def capture(params: dict[str, Any], model: Any, **_: Any) -> None:
        if model.name == "UpdateItem":
            seen.append(json.loads(params["body"]))

    client.boto.meta.events.register("before-call.dynamodb", capture, unique_id="bench-floor-check")
    try:
        client.acquire(f"floor-check-{uuid.uuid4().hex[:6]}").release()  # learns DynamoDB's clock
        seen.clear()
        client.acquire(f"floor-check-{uuid.uuid4().hex[:6]}").release()
    finally:
        client.close()
    problems = []
    if len(seen) != 2:
        return [f"expected 2 UpdateItems per acquire+release, saw {len(seen)}"]
    ours = [(Floor.ACQUIRE_EXPRESSION, Floor.ACQUIRE_CONDITION), (Floor.RELEASE_EXPRESSION, Floor.RELEASE_CONDITION)]
    for what, body, (update, condition) in zip(("acquire", "release"), seen, ours):
        if re.sub(r"#ring\[\d+\]", "#ring[{ring}]", body.get("UpdateExpression", "")) != update:
            problems.append(f"{what} UpdateExpression: engine {body.get('UpdateExpression')!r}, floor {update!r}")
        if body.get("ConditionExpression") != condition:
            problems.append(
                f"{what} ConditionExpression: engine {body.get('ConditionExpression')!r}, floor {condition!r}"
            )
    return problems


__all__ = ["Floor", "floor_differences", "used_only"]
