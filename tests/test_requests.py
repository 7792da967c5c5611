"""The requests of django_dynlock.engine.requests, read without a server.

DynamoDB refuses a request that defines an attribute name or value its expressions do
not use, or uses one it does not define; these tests check every request in each of its
shapes for that, and the clauses that the protocol depends on.
"""

from __future__ import annotations

import re

import pytest

from django_dynlock.engine import items as it
from django_dynlock.engine import requests as rq
from django_dynlock.engine.options import ClientOptions
from localdynamo.servers import DUMMY_REGION

OPTIONS = ClientOptions(table_name="locks", region_name=DUMMY_REGION)
OWNER = "web-1:42:abc:def"


def acquire(**overrides):
    fields = dict(
        owner=OWNER,
        rvn="r1",
        seq=1,
        lease_seconds=10.0,
        stamp=1_800_000_000.0,
        now=1_800_000_000.0,
        earliest=None,
        host="web-1",
        pid=42,
        thread="MainThread",
        holder={"view": "v"},
        takeover_rvn=None,
        base=1_800_000_000.0,
    )
    return rq.acquire(OPTIONS, "job:1", **{**fields, **overrides})


SHAPES = {
    "acquire": acquire(),
    "acquire, clock known": acquire(earliest=1_799_999_999.5),
    "acquire, taking over a watched holder": acquire(earliest=1_799_999_999.5, takeover_rvn="r0"),
    "acquire, clock unknown": acquire(base=None),
    "acquire, no Date": acquire(watch_only=True),
    "renew, no Date": rq.renew(
        OPTIONS, "job:1", owner=OWNER, rvn="r2", seq=2, lease_seconds=10.0, stamp=1_800_000_001.0, watch_only=True
    ),
    "renew": rq.renew(OPTIONS, "job:1", owner=OWNER, rvn="r2", seq=2, lease_seconds=10.0, stamp=1_800_000_001.0),
    "reserve": rq.reserve(OPTIONS, "job:1", owner=OWNER, holder="other"),
    "give up a reservation": rq.give_up_reservation(OPTIONS, "job:1", owner=OWNER),
    "mark a slot": rq.mark_slot(OPTIONS, "job:1", owner=OWNER, mark="lost:", now=1_800_000_000.0),
    "store a semaphore's limit": rq.set_limit(OPTIONS, "job:1", 5),
    "change a semaphore's limit": rq.set_limit(OPTIONS, "job:1", 5, force=True),
    "release": rq.release(OPTIONS, "job:1", owner=OWNER, fence=None, rvn="r3", now=1_800_000_000.0),
    "release with its fence": rq.release(OPTIONS, "job:1", owner=OWNER, fence=37, rvn="r3", now=1_800_000_000.0),
    **{
        f"break{' with a token' if token else ''}": rq.break_(
            OPTIONS, "job:1", condition=condition, values=values, mark="m", reason="", by="ops", now=1_800_000_000.0
        )
        for token in (None, 7)
        for condition, values in [rq.break_condition(token)]
    },
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_every_name_and_value_is_defined_and_used(shape):
    request = SHAPES[shape]
    text = " ".join(request.get(part, "") for part in ("UpdateExpression", "ConditionExpression"))
    assert set(re.findall(r"#\w+", text)) == set(request["ExpressionAttributeNames"])
    assert set(re.findall(r":\w+", text)) == set(request["ExpressionAttributeValues"])
    assert request["Key"] == {"key": {"S": "job:1"}}


def test_acquire_takes_a_free_key_or_its_own_earlier_attempt_only():
    condition = acquire()["ConditionExpression"]
    assert "attribute_not_exists(#owner)" in condition
    assert "NOT contains(#slot, :tag)" in condition and "NOT contains(#ring, :tag)" in condition  # no ghost holder
    assert "(#owner = :me AND #seq < :seq)" in condition  # an earlier attempt never lands after a later one
    assert "#expires_at" not in condition  # no takeover while DynamoDB's clock is unknown
    known = acquire(earliest=1_799_999_999.5)
    assert "#expires_at < :earliest" in known["ConditionExpression"]
    assert known["ExpressionAttributeValues"][":lapsed"] == it.num(1_799_999_999.5 - rq.RESERVATION_GRACE)


def test_acquire_stores_the_expiry_and_a_fence_above_every_earlier_one():
    values = acquire(stamp=1_800_000_000.25, base=1_800_000_000.25, lease_seconds=10.0)["ExpressionAttributeValues"]
    assert values[":expires"] == it.num(1_800_000_010.25)
    assert values[":base"] == it.num(1_800_000_000_250_000)  # the clock in µs, for an item TTL deleted
    assert values[":lease_ms"] == it.num(10_000)
    assert values[":gc"] == it.num(int(1_800_000_010.25 + OPTIONS.retention) + 1)


def test_only_dynamodbs_clock_starts_a_fencing_counter():
    unknown = acquire(base=None)["ConditionExpression"]
    assert unknown.endswith(") AND attribute_exists(#fence)") and unknown.startswith("(")
    assert "attribute_exists(#fence)" not in acquire()["ConditionExpression"]


def test_without_date_no_expiry_is_stored():
    for request in (acquire(watch_only=True), SHAPES["renew, no Date"]):
        assert "#expires_at = " not in request["UpdateExpression"]
        assert (
            request["UpdateExpression"].endswith(" #expires_at")
            and ":expires" not in request["ExpressionAttributeValues"]
        )
    assert " REMOVE #released_at, #reserved_by, #expires_at" in acquire(watch_only=True)["UpdateExpression"]


def test_renewals_are_ordered_by_their_sequence_number():
    assert SHAPES["renew"]["ConditionExpression"] == "#owner = :me AND #seq < :seq"


def test_a_release_with_its_fence_writes_the_ring_at_that_index():
    assert "#ring[5] = :tag" in SHAPES["release with its fence"]["UpdateExpression"]  # 37 % 16
    assert "#ring" not in SHAPES["release"]["UpdateExpression"]


def test_a_break_with_a_token_breaks_only_that_lease():
    assert SHAPES["break with a token"]["ConditionExpression"].endswith(" AND #fence = :token")
    assert SHAPES["break with a token"]["ExpressionAttributeValues"][":token"] == it.num(7)
    assert SHAPES["break"]["ExpressionAttributeValues"][":why"] == {"S": "no reason given"}


@pytest.mark.parametrize(
    "prefix, key_prefix, include_released, filtered",
    [("", "", True, False), ("job:", "", True, True), ("", "app/", True, True), ("", "", False, True)],
)
def test_a_scan_defines_and_uses_every_name_and_value(prefix, key_prefix, include_released, filtered):
    options = ClientOptions(table_name="locks", region_name=DUMMY_REGION, key_prefix=key_prefix)
    request = rq.scan(options, prefix, include_released=include_released, start={"key": {"S": "a"}}, limit=25)
    assert request["ConsistentRead"] is True and request["Limit"] == 25
    assert request["ExclusiveStartKey"] == {"key": {"S": "a"}}
    assert ("FilterExpression" in request) is filtered
    text = request.get("FilterExpression", "")
    assert set(re.findall(r"#\w+", text)) == set(request.get("ExpressionAttributeNames", {}))
    assert set(re.findall(r":\w+", text)) == set(request.get("ExpressionAttributeValues", {}))
    if key_prefix or prefix:
        assert request["ExpressionAttributeValues"][":prefix"] == {"S": key_prefix + prefix}


def test_a_scan_without_a_limit_reads_whole_pages():
    request = rq.scan(OPTIONS, limit=None, include_released=False)
    assert "Limit" not in request and "ExclusiveStartKey" not in request
    assert "attribute_exists(#owner) OR attribute_exists(#reserved_by)" in request["FilterExpression"]
