"""Fencing tokens never go backwards, even from a fresh process whose wall clock is a minute
slow, after the key's item was deleted (as TTL deletes an idle one): a new counter starts
from DynamoDB's clock only (issue 29). Before, a client's very first write took that base
from its host's wall clock, and the next token was a minute's worth of microseconds lower.
"""

from __future__ import annotations

import time

import pytest

from localdynamo.faultproxy import FaultProxy
from localdynamo.servers import dummy_client
from tests.support.clients import client_for
from tests.test_takeover import LEASE, lines, scenario  # noqa: F401 (a fixture)

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("first_read", ["answered", "lost"])
def test_a_slow_fresh_process_continues_the_tokens_after_the_item_was_deleted(scenario, server, first_read):  # noqa: F811
    client = client_for(server.endpoint_url, scenario.table)
    try:
        lease = client.acquire("k")
        last = lease.token
        lease.release()
    finally:
        client.close()
    # TTL deletes an item no sooner than a lease (+ RETENTION) after its last write: the
    # fresh process writes no sooner either. A new counter's first token is above every
    # token issued more than the clock's uncertainty (up to a second and a round trip)
    # earlier; a child that wrote 0.4 s after the release, as this test once let it, came
    # within that uncertainty and got a token 0.07 s worth lower, with or without the fix.
    time.sleep(LEASE)
    boto = dummy_client(server.endpoint_url)
    try:
        boto.delete_item(TableName=scenario.table, Key={"key": {"S": lease.stored_key}})
    finally:
        boto.close()
    with FaultProxy(server.endpoint_url, max_seconds=60) as link:
        if first_read == "lost":
            # The read that tells a fresh client DynamoDB's clock gets no answer: its first
            # write, not knowing the clock, must not start a counter (it applies only to an
            # existing item), and the next one does, by the clock its reply told.
            reset = link.add_fault("reset", operation="GetItem")
        report = scenario.start("try", "fresh", offset=-60.0, endpoint=link.endpoint_url)
        scenario.children[-1].wait(60)
    got = [int(w[1]) for w in lines(report) if w[0] == "GOT"]
    assert got, f"the fresh process did not get the free key: {lines(report)}"
    assert got[0] > last, f"token {got[0]} after {last}: {(last - got[0]) / 1e6:.1f} s worth lower"
    if first_read == "lost":
        assert reset.fired == 1
