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
    clock = ServerClock()
    clock.observe(sent=10.0, received=10.1, date=1000.0)  # offset in [989.9, 991.0)
    clock.observe(sent=10.9, received=11.0, date=1001.0)  # ticked over by 11.0: offset >= 990.0
    clock.observe(sent=11.4, received=11.5, date=1001.0)  # not yet at 11.4: offset < 990.6
    earliest, latest = clock.bounds(11.5)
    # (the lower bound dates from 11.0: it has widened by half a second's DRIFT)
    assert earliest == pytest.approx(1001.5 - 0.5 * DRIFT) and latest == pytest.approx(1002.1)
    earliest, latest = clock.bounds(111.5)  # 100 s without a reply
    assert earliest == pytest.approx(1101.5 - 100.5 * DRIFT) and latest == pytest.approx(1102.1 + 100 * DRIFT)


@pytest.mark.parametrize("outlier", [-60.0, +60.0, -2.0, +2.0])
def test_one_disagreeing_reply_widens_the_interval_and_never_narrows_it(caplog, outlier):
    """A lone reply from a clock off by ``outlier`` (a front end, an intermediary's Date)
    may widen the bounds; the holder's latest must not come down nor the taker's earliest go up."""
    clock = ServerClock()
    offset = 990.0  # the true server time is monotonic + 990
    for at in (10.0, 10.6, 11.2, 11.8):  # replies that straddle second boundaries
        clock.observe(sent=at, received=at + 0.05, date=float(int(at + 0.02 + offset)))
    earliest, latest = clock.bounds(12.0)
    assert earliest <= 12.0 + offset <= latest and latest - earliest < 0.7
    clock.observe(sent=12.0, received=12.05, date=float(int(12.02 + offset + outlier)))
    assert clock.jumps == 1
    assert "disagrees by about" in caplog.text
    after = clock.bounds(12.05)
    assert after[0] <= earliest + 0.05 and after[1] >= latest + 0.05 - 1e-9, (earliest, latest, after)
    # The interval covers both the earlier replies and the outlier, and a true reply narrows it again.
    assert after[0] <= 12.02 + offset + outlier <= after[1]
    clock.observe(sent=12.4, received=12.45, date=float(int(12.42 + offset)))
    earliest, latest = clock.bounds(12.45)
    assert earliest <= 12.45 + offset <= latest and latest - earliest < 1.1


def test_a_jump_of_the_servers_clock_is_followed_once_replies_agree(caplog):
    clock = ServerClock()
    clock.observe(sent=10.0, received=10.1, date=1000.0)
    clock.observe(sent=20.0, received=20.1, date=1070.0)  # 60 s more than 10 s can explain
    assert clock.jumps == 1 and "disagrees by about +60" in caplog.text
    earliest, latest = clock.bounds(20.1)
    assert earliest < 1011 and latest == pytest.approx(1071.0 + 0.1)  # both, until replies agree
    clock.observe(sent=20.5, received=20.6, date=1070.0)
    assert clock.bounds(20.6) == (pytest.approx(1070.0), pytest.approx(1070.0 + 1.0 + 0.1))


def test_http_dates():
    assert parse_http_date("Mon, 23 Nov 2026 03:27:16 GMT") == 1795404436.0
    assert parse_http_date(None) is None and parse_http_date("yesterday") is None
