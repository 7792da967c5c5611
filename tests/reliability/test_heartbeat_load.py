"""A short run of the heartbeat-load benchmark (bench/heartbeat_load.py), so it cannot rot.

The full benchmark (1 000 leases for a minute) is run by hand; its figures are in
docs/reliability.md. Here: 100 leases for 6 s with a 1 s heartbeat, the same rate of
renewals (100 a second) in a fraction of the time. The test drives it as a program
(``python -m bench.heartbeat_load ... --json FILE``): tests/ does not import bench/.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from localdynamo.servers import REPO_ROOT, server_env

# Renewal rates: run alone, after the parallel pass (`make test`).
pytestmark = [pytest.mark.slow, pytest.mark.solo]


def heartbeat_load(tmp_path, server, **options: float) -> dict:
    """The figures of one ``python -m bench.heartbeat_load`` run against ``server``."""
    out = tmp_path / "heartbeat-load.json"
    command = [sys.executable, "-m", "bench.heartbeat_load", "--endpoint", server.endpoint_url]
    command += ["--server-pid", str(server.pid), "--json", str(out)]
    for name, value in options.items():
        command += [f"--{name}", f"{value:g}"]
    run = subprocess.run(command, cwd=REPO_ROOT, env=server_env(), capture_output=True, text=True, timeout=180)
    assert out.exists(), f"exit {run.returncode}\n{run.stdout}\n{run.stderr}"
    return json.loads(out.read_text())


def test_one_process_keeps_hundreds_of_leases_renewed_at_the_configured_rate(moto_server, tmp_path):
    result = heartbeat_load(tmp_path, moto_server, leases=100, seconds=6.0, lease=3.0, heartbeat=1.0)
    assert result["leases_lost"] == 0 and result["renewals_failed_in_hold"] == 0, result
    assert "lost:expired" not in result["events"] and "at_risk" not in result["events"], result
    # Each lease is renewed every 0.85-1.0 heartbeat periods: about 108 a second here.
    assert (
        0.8 * result["configured_per_second"] <= result["renewals_per_second"] <= 1.25 * result["configured_per_second"]
    ), result
    # The holder stops trusting a lease 0.9 lease after its last renewal: stay well inside.
    assert result["longest_gap_between_renewals"] < 0.75 * result["lease"], result
