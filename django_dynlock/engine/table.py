"""Creating and inspecting the lock table: partition key only, on-demand, TTL on.

Idempotent by design: an existing table with the right key schema is accepted and
only has TTL switched on if it was off. Servers without the TTL API (dynalite) get a
logged warning, not a failure: TTL only garbage-collects idle items.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from ..exceptions import BackendError, InvalidArgument
from .failures import error_code, safe_endpoint
from .options import ClientOptions
from .store import Store

logger = logging.getLogger("django_dynlock")

TTL_UNSUPPORTED = "UNSUPPORTED"
UNKNOWN_OPERATION = ("UnknownOperationException", "UnrecognizedOperationException")


@dataclass
class TableStatus:
    name: str
    status: str  # CREATING, ACTIVE, ...
    key_attribute: str
    key_problem: str | None  # why the key schema does not fit, or None
    ttl_status: str  # ENABLED, ENABLING, DISABLED, DISABLING or UNSUPPORTED
    ttl_attribute: str | None
    billing_mode: str | None
    item_count: int | None
    created: bool = False  # True if this call created the table
    replicas: tuple[str, ...] = ()  # Regions of a global table's replicas
    multi_region_consistency: str | None = None  # a global table's: EVENTUAL (the default) or STRONG

    @property
    def ok(self) -> bool:
        return self.key_problem is None and self.status == "ACTIVE"

    def __str__(self) -> str:
        made = "created" if self.created else "exists"
        return f"table {self.name}: {made}, {self.status}, TTL {self.ttl_status} on {self.ttl_attribute or '-'}"


def table_definition(
    options: ClientOptions,
    *,
    billing_mode: str = "PAY_PER_REQUEST",
    read_capacity: int | None = None,
    write_capacity: int | None = None,
) -> dict[str, Any]:
    """The CreateTable parameters of the lock table: partition key only (``key_attribute``,
    a string). Also valid for ``aws dynamodb create-table --cli-input-json``."""
    params: dict[str, Any] = {
        "TableName": options.table_name,
        "KeySchema": [{"AttributeName": options.key_attribute, "KeyType": "HASH"}],
        "AttributeDefinitions": [{"AttributeName": options.key_attribute, "AttributeType": "S"}],
        "BillingMode": billing_mode,
    }
    if billing_mode == "PROVISIONED":
        if not read_capacity or not write_capacity or read_capacity < 1 or write_capacity < 1:
            raise InvalidArgument("PROVISIONED billing needs read_capacity and write_capacity of at least 1")
        params["ProvisionedThroughput"] = {"ReadCapacityUnits": read_capacity, "WriteCapacityUnits": write_capacity}
    elif billing_mode != "PAY_PER_REQUEST":
        raise InvalidArgument(f"billing_mode must be PAY_PER_REQUEST or PROVISIONED, got {billing_mode!r}")
    return params


def ttl_specification(options: ClientOptions) -> dict[str, Any]:
    """TTL on ``ttl_attribute``: UpdateTimeToLive's ``TimeToLiveSpecification`` (CloudFormation's too)."""
    return {"Enabled": True, "AttributeName": options.ttl_attribute}


def _key_problem(table: dict[str, Any], key_attribute: str) -> str | None:
    schema = table.get("KeySchema", [])
    types = {a["AttributeName"]: a["AttributeType"] for a in table.get("AttributeDefinitions", [])}
    hashes = [k["AttributeName"] for k in schema if k["KeyType"] == "HASH"]
    ranges = [k["AttributeName"] for k in schema if k["KeyType"] == "RANGE"]
    if hashes != [key_attribute]:
        return f"partition key is {hashes[0] if hashes else None!r}, expected {key_attribute!r}"
    if types.get(key_attribute) != "S":
        return f"partition key {key_attribute!r} has type {types.get(key_attribute)!r}, expected 'S' (string)"
    if ranges:
        return f"table has a sort key {ranges[0]!r}; the lock table must have a partition key only"
    return None


def _ttl(store: Store) -> tuple[str, str | None]:
    try:
        reply = store.send("describe_time_to_live", {"TableName": store.options.table_name})
    except ClientError as exc:
        if error_code(exc) in UNKNOWN_OPERATION:
            return TTL_UNSUPPORTED, None
        raise
    description = reply.get("TimeToLiveDescription", {})
    return description.get("TimeToLiveStatus", "DISABLED"), description.get("AttributeName")


def describe_table(store: Store) -> TableStatus:
    table = store.send("describe_table", {"TableName": store.options.table_name})["Table"]
    ttl_status, ttl_attribute = _ttl(store)
    return TableStatus(
        name=table["TableName"],
        status=table.get("TableStatus", "ACTIVE"),
        key_attribute=store.options.key_attribute,
        key_problem=_key_problem(table, store.options.key_attribute),
        ttl_status=ttl_status,
        ttl_attribute=ttl_attribute,
        billing_mode=table.get("BillingModeSummary", {}).get("BillingMode", "PROVISIONED"),
        item_count=table.get("ItemCount"),
        replicas=tuple(replica.get("RegionName", "?") for replica in table.get("Replicas") or ()),
        multi_region_consistency=table.get("MultiRegionConsistency"),
    )


def create_table(
    store: Store,
    *,
    wait: bool,
    billing_mode: str,
    read_capacity: int | None,
    write_capacity: int | None,
    timeout: float,
) -> TableStatus:
    options = store.options
    params = table_definition(
        options, billing_mode=billing_mode, read_capacity=read_capacity, write_capacity=write_capacity
    )
    created = True
    try:
        store.send("create_table", params)
    except ClientError as exc:
        if error_code(exc) != "ResourceInUseException":
            raise
        created = False
    status = describe_table(store)
    if status.key_problem:
        raise BackendError(f"table {options.table_name!r} exists but does not fit: {status.key_problem}")
    deadline = time.monotonic() + timeout
    while wait and status.status != "ACTIVE":
        if time.monotonic() >= deadline:
            raise BackendError(
                f"table {options.table_name!r} is still {status.status} after {timeout:.0f}s", retryable=True
            )
        time.sleep(0.5)
        status = describe_table(store)
    status.created = created
    if status.ttl_status == "DISABLED" and status.status == "ACTIVE":
        try:
            store.boto.update_time_to_live(
                TableName=options.table_name,
                TimeToLiveSpecification=ttl_specification(options),
            )
        except ClientError as exc:
            if error_code(exc) not in UNKNOWN_OPERATION:
                raise
            status.ttl_status = TTL_UNSUPPORTED  # dynalite can describe TTL but not enable it
        else:
            status.ttl_status, status.ttl_attribute = _ttl(store)
    if status.ttl_status == TTL_UNSUPPORTED:
        logger.warning(
            "DynamoDB server at %s has no TTL API: idle lock items will not be deleted automatically",
            safe_endpoint(options.endpoint_url),
        )
    elif status.ttl_attribute not in (None, options.ttl_attribute):
        logger.warning(
            "table %r has TTL on %r, not on %r: idle lock items will not expire",
            options.table_name,
            status.ttl_attribute,
            options.ttl_attribute,
        )
    return status
