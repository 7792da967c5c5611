"""A holder whose replies carry no ``Date`` must not stamp its expiry by its own wall clock
(issue 29): a taker that sees ``Date`` would trust that stamp. Its writes store no expiry,
so only a waiter that watches the key unchanged for a whole lease takes it over.

The holder's wall clock runs a minute slow and reaches the server through a fault proxy
that strips ``Date`` from every reply; the taker talks to the server directly.
"""

from __future__ import annotations

import pytest

from localdynamo.faultproxy import FaultProxy
from tests.test_takeover import (  # noqa: F401
    LEASE,
    MARGIN,
    assert_never_taken_while_live,
    kill,
    last_write,
    lines,
    scenario,
    winning_send,
)

pytestmark = pytest.mark.slow


def test_a_dateless_holder_with_a_slow_wall_clock_is_taken_over_only_once_dead(scenario, server):  # noqa: F811
    with FaultProxy(server.endpoint_url, max_seconds=120) as link:
        link.set_dates(strip=True)
        holder, report = scenario.holder(offset=-60.0, endpoint=link.endpoint_url)
        taker = scenario.start("retry", "taker", seconds=3 * LEASE)
        scenario.children[-1].wait(60)
        assert_never_taken_while_live(taker, report)
        kill(holder)
        # A waiting acquire: the watch needs reads, which a try_acquire on a server that
        # returns no item on a failed condition (dynalite) does not make.
        retrier = scenario.start("wait", "retrier", seconds=LEASE + 10)
        scenario.children[-1].wait(60)
    taken_at = winning_send(retrier)
    assert taken_at is not None, "nobody took the dead holder's key"
    last = last_write(report)
    assert taken_at >= last + LEASE - MARGIN, f"taken {taken_at - last:.2f}s after its last write: too early"
    print(f"\ntaken over {taken_at - last:.2f}s after the dead holder's last write, by the watch")
