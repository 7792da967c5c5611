"""One disagreeing ``Date`` must never let two processes hold a key (issue 29).

Each process talks to the server through a fault proxy of its own, which can move one
reply's ``Date`` by a minute, as an intermediary or a front end with a skewed clock
would. Before, one such reply replaced the client's whole view of DynamoDB's clock: a
holder stamped its next expiry a minute early, a taker judged a live lease a minute
old. Now a lone outlier only widens the client's uncertainty.
"""

from __future__ import annotations

import itertools

import pytest

from localdynamo.faultproxy import FaultProxy
from tests.support.polling import wait_for
from tests.test_takeover import LEASE, kill, lines, scenario, winning_send  # noqa: F401 (scenario is a fixture)

pytestmark = pytest.mark.slow


@pytest.fixture
def proxies(server):
    started: list[FaultProxy] = []

    def make() -> FaultProxy:
        started.append(FaultProxy(server.endpoint_url, max_seconds=120).start())
        return started[-1]

    yield make
    for proxy in started:
        proxy.stop()


def writes(report) -> int:
    return sum(1 for w in lines(report) if w[0] == "WROTE")


def last_held(report) -> float:
    return max(float(w[1]) for w in lines(report) if w[0] == "HELD")


def assert_no_overlap(holder_report, taker_report) -> None:
    taken_at = winning_send(taker_report)
    assert taken_at is not None, "nobody took the key once the holder's lease had run out"
    believed = last_held(holder_report)
    assert taken_at >= believed, f"taken while the holder still believed its lease, {believed - taken_at:.2f}s before"
    print(f"\ntaken {taken_at - believed:.2f}s after the holder last believed its lease")


def test_a_holder_that_saw_one_backward_dated_reply_and_lost_its_link(scenario, proxies):  # noqa: F811
    link = proxies()
    holder, report = scenario.holder(endpoint=link.endpoint_url)
    taker = scenario.start("retry", "taker", seconds=LEASE + 8)
    wait_for(lambda: any(w[0] == "BUSY" for w in lines(taker)), 30, "the taker to find the key busy")
    # One renewal's reply dated a minute back; the next renewal lands, its reply lost,
    # and from then on the link is down.
    shifted = link.add_fault("shift_date", operation="UpdateItem", date_offset=-60.0)
    landed = link.add_fault("drop_reply", operation="UpdateItem", match=lambda body: shifted.fired > 0)
    link.add_fault("reset", times=10**6, match=lambda body: landed.fired > 0)
    wait_for(lambda: landed.fired, 10, "the renewal after the backward-dated reply")
    scenario.children[-1].wait(60)
    wait_for(lambda: any(w[0] == "LOST" for w in lines(report)), 10, "the cut-off holder to stop trusting its lease")
    kill(holder)
    assert_no_overlap(report, taker)


def test_a_taker_that_saw_one_forward_dated_reply_while_the_holder_was_cut_off(scenario, proxies):  # noqa: F811
    link, taker_link = proxies(), proxies()
    holder, report = scenario.holder(endpoint=link.endpoint_url)
    taker = scenario.start("retry", "taker", seconds=LEASE + 8, endpoint=taker_link.endpoint_url)
    wait_for(lambda: any(w[0] == "BUSY" for w in lines(taker)), 30, "the taker to find the key busy")
    renewed = writes(report)
    wait_for(lambda: writes(report) > renewed, 10, "the holder's next renewal")
    link.pause()  # the holder is cut off, and trusts its lease until it runs out
    later = itertools.count()
    taker_link.add_fault("shift_date", date_offset=+60.0, match=lambda body: next(later) >= 1)
    scenario.children[-1].wait(60)
    wait_for(lambda: any(w[0] == "LOST" for w in lines(report)), 10, "the cut-off holder to stop trusting its lease")
    kill(holder)
    assert_no_overlap(report, taker)
