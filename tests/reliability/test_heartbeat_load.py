"""A short run of the heartbeat-load benchmark (bench/heartbeat_load.py), so it cannot rot.

The full benchmark (1 000 leases for a minute) is run by hand; its figures are in
docs/reliability.md. Here: 100 leases for 6 s with a 1 s heartbeat, the same rate of
renewals (100 a second) in a fraction of the time.
"""

from __future__ import annotations

import pytest

from bench.heartbeat_load import run

pytestmark = pytest.mark.slow


def test_one_process_keeps_hundreds_of_leases_renewed_at_the_configured_rate(moto_server):
    result = run(
        moto_server.endpoint_url, leases=100, seconds=6.0, lease=3.0, heartbeat=1.0, server_pid=moto_server.pid
    )
    assert result["leases_lost"] == 0 and result["renewals_failed_in_hold"] == 0, result
    assert "lost:expired" not in result["events"] and "at_risk" not in result["events"], result
    # Each lease is renewed every 0.85-1.0 heartbeat periods: about 108 a second here.
    assert (
        0.8 * result["configured_per_second"] <= result["renewals_per_second"] <= 1.25 * result["configured_per_second"]
    ), result
    # The holder stops trusting a lease 0.9 lease after its last renewal: stay well inside.
    assert result["longest_gap_between_renewals"] < 0.75 * result["lease"], result
