"""ClientOptions built without Django take the defaults a DYNLOCK alias gets (issue 35 item 7).

The heartbeat and the request timeouts follow the lease when left out: the rule is
engine.options' (lease_fitted_defaults), applied by ClientOptions and by conf.py alike.
"""

from __future__ import annotations

import time

import pytest
from botocore.config import Config

from django_dynlock import InvalidArgument, LockClient
from django_dynlock.conf import get_options
from django_dynlock.engine import ClientOptions
from django_dynlock.engine.options import call_budget
from localdynamo.faultproxy import FaultProxy
from tests.support.clients import OPTIONS
from tests.test_exclusion import is_renewal


@pytest.mark.parametrize("lease", [9.0, 12, 20.0, 30.0, 90.0])
def test_options_with_only_a_lease_get_the_heartbeat_and_timeouts_an_alias_gets(settings, lease):
    options = ClientOptions(lease_duration=lease)
    assert options.heartbeat_period == min(10.0, lease / 3)
    assert call_budget(options.client_config) <= max(lease / 2, 4.5)  # 4.5 s: the timeouts' floor, half of 1 + 2 s
    settings.DYNLOCK = {"default": {"LEASE_DURATION": lease, "ENDPOINT_URL": "http://127.0.0.1:1"}}
    alias = get_options()
    assert (options.heartbeat_period, options.client_config.connect_timeout, options.client_config.read_timeout) == (
        alias.heartbeat_period,
        alias.client_config.connect_timeout,
        alias.client_config.read_timeout,
    )
    assert options.client_config.retries == alias.client_config.retries


def test_what_is_given_is_kept_and_a_heartbeat_too_slow_for_the_lease_still_refused():
    with pytest.raises(InvalidArgument, match=r"heartbeat_period \(10.0s\) must be at most a third"):
        ClientOptions(lease_duration=9.0, heartbeat_period=10.0)
    given = ClientOptions(lease_duration=9.0, heartbeat_period=1.0, client_config=Config(read_timeout=2.0))
    assert given.heartbeat_period == 1.0 and given.client_config.read_timeout == 2.0


def test_a_9_s_lease_whose_renewals_hang_is_at_risk_before_it_is_lost(dynlock):
    # Built with fixed defaults, ClientOptions(lease_duration=9.0) was refused; with the
    # heartbeat alone fitted, a renewal hanging through three 1 + 2 s tries outlasted the
    # lease, and its holder was told it had lost it with no warning first.
    events: list[tuple[str, float]] = []
    with FaultProxy(dynlock.server.endpoint_url, max_seconds=60) as proxy:
        holder = LockClient(
            ClientOptions(
                endpoint_url=proxy.endpoint_url, table_name=dynlock.options.table_name, lease_duration=9.0, **OPTIONS
            ),
            listeners=[lambda event, **info: events.append((event, time.monotonic()))],
        )
        try:
            lease = holder.acquire("hung", wait=5)
            hung = proxy.add_fault("delay", operation="UpdateItem", match=is_renewal, times=20, delay_seconds=5.0)
            deadline = time.monotonic() + 15
            while not any(name == "lost" for name, _ in events) and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            holder.close()
    names = [name for name, _ in events]
    assert hung.fired >= 1 and names[:3] == ["acquired", "at_risk", "lost"], names
    at_risk, lost = events[1][1], events[2][1]
    assert lost - at_risk >= 1.0, "warned too late to act on it"
    assert lease.lost_reason == "expired"
