"""Counting the DynamoDB API calls a LockClient makes."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator


@contextlib.contextmanager
def count_calls(client) -> Iterator[Counter]:
    """Count DynamoDB API calls (not HTTP retries) made through a LockClient's boto3 client."""
    calls: Counter = Counter()

    def on_call(model, **kwargs):
        calls[model.name] += 1

    events = client.boto.meta.events
    events.register("before-call.dynamodb", on_call, unique_id=f"count-{id(calls)}")
    try:
        yield calls
    finally:
        events.unregister("before-call.dynamodb", unique_id=f"count-{id(calls)}")
