"""DynamoDB's per-partition throughput, modelled for the fault proxy: a token bucket per key.

AWS documents that one partition serves at most 3,000 read units and 1,000 write units per
second, on-demand tables included, and answers a request beyond that with a 400
``ProvisionedThroughputExceededException`` (provisioned tables) or ``ThrottlingException``
(on-demand), which the SDKs retry. Every lock key is an item of its own and may sit in a
partition of its own, so here each partition-key value gets two buckets, reads and writes
counted apart; a request is throttled when its units are not in its bucket, and a
throttled request takes nothing from it (as DynamoDB's does not).

Units, by DynamoDB's rules for items under 1 KB: a strongly consistent read 1, an
eventually consistent one 0.5; a write 1; each item of a transaction twice that. A
request that touches several keys (a transaction, a batch) goes through only if every one
of its keys has the units, and then takes them from each; DynamoDB would answer a batch
in part (``UnprocessedItems``), which this model does not. Scans, queries and table
requests touch no key and are never throttled here.

Rates scale down for tests (``Partitions(read_units=30, write_units=10)``). A bucket holds
``burst_seconds`` of its rate and starts full; DynamoDB keeps up to 300 s of unused
capacity for bursts, which a short test would never exhaust, so the default here is 1 s.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["AWS_READ_UNITS", "AWS_WRITE_UNITS", "THROTTLE_MESSAGES", "KeyCounts", "Partitions", "units_by_key"]

AWS_READ_UNITS = 3000.0
AWS_WRITE_UNITS = 1000.0

# Messages in the manner of DynamoDB's for the two codes (clients go by the code).
THROTTLE_MESSAGES = {
    "ProvisionedThroughputExceededException": (
        "The level of configured provisioned throughput for the table was exceeded. "
        "Consider increasing your provisioning level with the UpdateTable API."
    ),
    "ThrottlingException": (
        "Throughput exceeds the current throughput limit for your table. Reduce the request rate and try again."
    ),
}

READS = frozenset({"GetItem", "BatchGetItem", "TransactGetItems"})
WRITES = frozenset({"PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem", "TransactWriteItems"})


@dataclass
class KeyCounts:
    """What one key's partition saw: requests let through and throttled, reads and writes apart."""

    reads: int = 0
    writes: int = 0
    read_throttles: int = 0
    write_throttles: int = 0

    @property
    def requests(self) -> int:
        return self.reads + self.writes + self.read_throttles + self.write_throttles

    @property
    def throttles(self) -> int:
        return self.read_throttles + self.write_throttles


class _Bucket:
    def __init__(self, rate: float, capacity: float, now: float):
        self.rate, self.capacity = rate, capacity
        self.tokens, self.at = capacity, now

    def refill(self, now: float) -> None:
        self.tokens = min(self.capacity, self.tokens + (now - self.at) * self.rate)
        self.at = now


class Partitions:
    """Token buckets per partition-key value; thread-safe. ``admit(operation, body)`` says
    whether a request goes through (and takes its units) or is throttled."""

    def __init__(
        self,
        read_units: float = AWS_READ_UNITS,
        write_units: float = AWS_WRITE_UNITS,
        *,
        burst_seconds: float = 1.0,
        key_attribute: str = "key",
        error_code: str = "ProvisionedThroughputExceededException",
        clock: Callable[[], float] = time.monotonic,
    ):
        if read_units <= 0 or write_units <= 0:
            raise ValueError("read_units and write_units must be > 0 (units per second per partition)")
        if burst_seconds <= 0:
            raise ValueError("burst_seconds must be > 0")
        if error_code not in THROTTLE_MESSAGES:
            raise ValueError(f"error_code must be one of {sorted(THROTTLE_MESSAGES)}, got {error_code!r}")
        self.read_units, self.write_units = float(read_units), float(write_units)
        self.burst_seconds = burst_seconds
        self.key_attribute = key_attribute
        self.error_code = error_code
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[tuple[str, str], _Bucket] = {}
        self._counts: dict[str, KeyCounts] = {}

    @property
    def error_message(self) -> str:
        return THROTTLE_MESSAGES[self.error_code]

    def admit(self, operation: str, body: dict[str, Any]) -> bool:
        """Count the request; False if DynamoDB would throttle it."""
        kind = "read" if operation in READS else "write" if operation in WRITES else None
        if kind is None:
            return True
        units = units_by_key(operation, body, self.key_attribute)
        if not units:
            return True
        rate = self.read_units if kind == "read" else self.write_units
        with self._lock:
            now = self._clock()
            buckets = []
            for key in units:
                bucket = self._buckets.get((kind, key))
                if bucket is None:
                    bucket = self._buckets[(kind, key)] = _Bucket(rate, rate * self.burst_seconds, now)
                bucket.refill(now)
                buckets.append(bucket)
            admitted = all(bucket.tokens >= units[key] for key, bucket in zip(units, buckets))
            for key, bucket in zip(units, buckets):
                counts = self._counts.setdefault(key, KeyCounts())
                if admitted:
                    bucket.tokens -= units[key]
                if kind == "read":
                    counts.reads += admitted
                    counts.read_throttles += not admitted
                else:
                    counts.writes += admitted
                    counts.write_throttles += not admitted
            return admitted

    def counts(self) -> dict[str, KeyCounts]:
        """A copy of the counters, by partition-key value."""
        with self._lock:
            return {key: KeyCounts(**vars(c)) for key, c in self._counts.items()}

    def total(self) -> KeyCounts:
        total = KeyCounts()
        for c in self.counts().values():
            total.reads += c.reads
            total.writes += c.writes
            total.read_throttles += c.read_throttles
            total.write_throttles += c.write_throttles
        return total


def _key_value(key: dict[str, Any], key_attribute: str) -> str | None:
    """A partition-key value as text (``{"S": "k"}`` -> ``"k"``), from a ``Key`` or an ``Item``."""
    value = key.get(key_attribute)
    if value is None and len(key) == 1:
        value = next(iter(key.values()))  # a Key of a table with a partition key only
    if not isinstance(value, dict) or len(value) != 1:
        return None
    return str(next(iter(value.values())))


def units_by_key(operation: str, body: dict[str, Any], key_attribute: str = "key") -> dict[str, float]:
    """The capacity units a request takes from each partition-key value it touches."""
    found: dict[str, float] = {}

    def add(key: Any, units: float) -> None:
        if isinstance(key, dict) and (value := _key_value(key, key_attribute)) is not None:
            found[value] = found.get(value, 0.0) + units

    read = 1.0 if body.get("ConsistentRead") else 0.5
    if operation == "GetItem":
        add(body.get("Key"), read)
    elif operation in ("UpdateItem", "DeleteItem"):
        add(body.get("Key"), 1.0)
    elif operation == "PutItem":
        add(body.get("Item"), 1.0)
    elif operation == "BatchGetItem":
        for request in (body.get("RequestItems") or {}).values():
            per = 1.0 if request.get("ConsistentRead") else 0.5
            for key in request.get("Keys") or ():
                add(key, per)
    elif operation == "BatchWriteItem":
        for writes in (body.get("RequestItems") or {}).values():
            for write in writes:
                add((write.get("PutRequest") or {}).get("Item"), 1.0)
                add((write.get("DeleteRequest") or {}).get("Key"), 1.0)
    elif operation in ("TransactWriteItems", "TransactGetItems"):
        for item in body.get("TransactItems") or ():
            for action in item.values():
                if isinstance(action, dict):
                    add(action.get("Key") or action.get("Item"), 2.0)
    return found
