"""DynamoDB's clock as the client learns it from the Date header of real replies.

On loopback the server runs on this host, so its clock is our wall clock: the bounds
the client derives must always contain ``time.time()``, and narrow to about a round
trip once replies have straddled a second boundary.
"""

from __future__ import annotations

import time

import pytest

from django_dynlock.engine.clock import DRIFT, ServerClock, parse_http_date


def test_bounds_always_contain_the_servers_clock_and_narrow(dynlock):
    clock = dynlock.clock
    widths = []
    for _ in range(120):  # about 3 s of requests: several second boundaries
        dynlock.get("probe")
        before = time.time()
        earliest, latest = clock.bounds()
        after = time.time()
        assert earliest <= after and before <= latest, (earliest, before, after, latest)
        widths.append(latest - earliest)
        time.sleep(0.02)
    assert clock.jumps == 0
    assert widths[-1] < 0.25, widths[-10:]  # about a round trip, not the header's 1 s


def test_a_first_reply_bounds_the_clock_to_a_second_and_a_round_trip():
    clock = ServerClock()
    assert clock.bounds(10.0) is None and not clock.known
    clock.observe(sent=10.0, received=10.2, date=1000.0)
    earliest, latest = clock.bounds(10.2)
    assert earliest == pytest.approx(1000.0) and latest == pytest.approx(1001.0 + 0.2)


def test_replies_narrow_the_interval_and_it_widens_with_time():
    # A bound moves inwards only as far as two replies in a row allow (see the next test).
    clock = ServerClock()
    clock.observe(sent=10.0, received=10.1, date=1000.0)  # offset in [989.9, 991.0)
    clock.observe(sent=10.9, received=11.0, date=1001.0)  # ticked over by 11.0: offset >= 990.0
    assert clock.bounds(11.0)[0] == pytest.approx(11.0 + 989.9 - 0.9 * DRIFT)  # its word alone
    clock.observe(sent=10.95, received=11.0, date=1001.0)  # and again: two in a row say so
    clock.observe(sent=11.4, received=11.5, date=1001.0)  # not yet at 11.4: offset < 990.6
    clock.observe(sent=11.45, received=11.5, date=1001.0)  # and again
    earliest, latest = clock.bounds(11.5)
    # (the lower bound dates from 11.0: it has widened by half a second's DRIFT)
    assert earliest == pytest.approx(1001.5 - 0.5 * DRIFT) and latest == pytest.approx(1002.1)
    earliest, latest = clock.bounds(111.5)  # 100 s without a reply
    assert earliest == pytest.approx(1101.5 - 100.5 * DRIFT) and latest == pytest.approx(1102.1 + 100 * DRIFT)


def test_no_lone_reply_narrows_the_interval():
    # The schedule explorer's seed 1251 in small: a first reply that took 2.4 s leaves the
    # bounds 3.4 s wide; the next reply, from a clock 2 s behind (a front end, an
    # intermediary), falls inside them. Taken as agreeing, it narrowed the upper bound
    # below DynamoDB's clock: a holder's expiry stamped early, and a taker took the key
    # while the holder still trusted its lease.
    clock = ServerClock()
    offset = 990.0  # the true server time is monotonic + 990
    clock.observe(sent=10.0, received=12.4, date=float(int(11.2 + offset)))
    clock.observe(sent=13.0, received=13.05, date=float(int(13.02 + offset - 2.0)))
    earliest, latest = clock.bounds(13.05)
    assert earliest <= 13.05 + offset <= latest, (earliest, latest)
    assert clock.jumps == 0  # inside the bounds: nothing to warn of
    # Two true replies in a row narrow them again.
    clock.observe(sent=13.5, received=13.55, date=float(int(13.52 + offset)))
    clock.observe(sent=13.6, received=13.65, date=float(int(13.62 + offset)))
    earliest, latest = clock.bounds(13.65)
    assert earliest <= 13.65 + offset <= latest and latest - earliest < 1.2, (earliest, latest)


@pytest.mark.parametrize("outlier", [-60.0, +60.0, -2.0, +2.0])
def test_one_disagreeing_reply_widens_the_interval_and_never_narrows_it(caplog, outlier):
    """A lone reply from a clock off by ``outlier`` (a front end, an intermediary's Date)
    may widen the bounds; the holder's latest must not come down nor the taker's earliest go up."""
    clock = ServerClock()
    offset = 990.0  # the true server time is monotonic + 990
    for tenth in range(100, 120):  # replies that straddle second boundaries
        at = tenth / 10
        clock.observe(sent=at, received=at + 0.05, date=float(int(at + 0.02 + offset)))
    earliest, latest = clock.bounds(12.0)
    assert earliest <= 12.0 + offset <= latest and latest - earliest < 0.7
    clock.observe(sent=12.0, received=12.05, date=float(int(12.02 + offset + outlier)))
    assert clock.jumps == 1
    assert "disagrees by about" in caplog.text
    after = clock.bounds(12.05)
    assert after[0] <= earliest + 0.05 and after[1] >= latest + 0.05 - 1e-9, (earliest, latest, after)
    # The interval covers both the earlier replies and the outlier, and true replies narrow it again.
    assert after[0] <= 12.02 + offset + outlier <= after[1]
    clock.observe(sent=12.4, received=12.45, date=float(int(12.42 + offset)))
    clock.observe(sent=12.5, received=12.55, date=float(int(12.52 + offset)))
    earliest, latest = clock.bounds(12.55)
    assert earliest <= 12.55 + offset <= latest and latest - earliest < 1.1


def test_a_jump_of_the_servers_clock_is_followed_once_replies_agree(caplog):
    clock = ServerClock()
    clock.observe(sent=10.0, received=10.1, date=1000.0)
    clock.observe(sent=20.0, received=20.1, date=1070.0)  # 60 s more than 10 s can explain
    assert clock.jumps == 1 and "disagrees by about +60" in caplog.text
    earliest, latest = clock.bounds(20.1)
    assert earliest < 1011 and latest == pytest.approx(1071.0 + 0.1)  # both, until replies agree
    clock.observe(sent=20.5, received=20.6, date=1070.0)
    clock.observe(sent=20.55, received=20.6, date=1070.0)
    assert clock.bounds(20.6) == (pytest.approx(1070.0), pytest.approx(1070.0 + 1.0 + 0.1))


def test_http_dates():
    assert parse_http_date("Mon, 23 Nov 2026 03:27:16 GMT") == 1795404436.0
    assert parse_http_date(None) is None and parse_http_date("yesterday") is None
