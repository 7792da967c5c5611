"""Thousands of contended critical sections with and without 10% mixed faults.

One run per server (AWS's DynamoDB Local and dynalite, the suite's server matrix; moto
keeps the other fault-proxy tests): worker processes, each behind its own
FaultProxy, loop acquire -> read counter -> sleep -> raise_if_lost -> write ->
release on a few keys. First without faults, then with 10% of all requests faulted:
2.5% each of HTTP 500, throttling, connection reset, reply dropped after the write
was applied, and a 300 ms delay (longer than the 250 ms read timeout, so the client
gives up and retries while the request is still on its way).

Two checks on the same run: the history has no violation, and contended throughput
under faults stays at least a third of the fault-free figure.

With ``-s`` each run prints its figures (sections, faults, rates, idle keys).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import pytest

from tests.reliability.harness import FAULT_DELAY, MIXED_FAULTS, Results, Scenario, stalls
from tests.reliability.history import summarize

# Rates and section counts: run alone, after the parallel pass (`make test`).
pytestmark = [pytest.mark.slow, pytest.mark.solo]

LEASE = 4.0
SERVERS = ["dynamodb-local", "dynalite"]
# (workers, keys, fault-free window, faulty window) in seconds
DEFAULT = (4, 2, 8.0, 20.0)
LONG = (6, 3, 30.0, 120.0)


@dataclass
class Run:
    kind: str
    results: Results
    clean: tuple[float, float]
    faulty: tuple[float, float]
    faults: dict[str, int]
    requests: int
    late_duplicates: list = field(default_factory=list)

    def rate(self, window: tuple[float, float]) -> float:
        start, end = window
        return sum(1 for s in self.results.sections if start <= s.start < end) / (end - start)

    @property
    def ratio(self) -> float:
        return self.rate(self.faulty) / self.rate(self.clean)

    def idle_keys(self) -> list[tuple[str, float, float]]:
        """Keys that stood idle for a whole lease under faults, although workers were waiting."""
        return stalls(self.results.sections, *self.faulty, longer_than=LEASE * 0.9)

    def describe(self) -> str:
        faulty_sections = sum(1 for s in self.results.sections if self.faulty[0] <= s.start < self.faulty[1])
        idle = self.idle_keys()
        return (
            f"{self.kind}: {len(self.results.sections)} sections ({faulty_sections} under faults), "
            f"{self.requests} requests, faults {self.faults}; fault-free {self.rate(self.clean):.1f}/s, "
            f"faulty {self.rate(self.faulty):.1f}/s, ratio {self.ratio:.3f}; {len(idle)} keys idle for a "
            f"lease or more ({sum(g for _, _, g in idle):.1f} s in all), {len(self.late_duplicates)} acquire "
            f"requests applied after their own retry; violations {len(self.results.violations)}; "
            f"worker stats {dict(self.results.stats)}"
        )


def late_duplicates(proxies) -> list:
    """Delayed acquire requests that were applied (HTTP 200 upstream) after the client gave up on them."""
    return [
        r
        for proxy in proxies.proxies
        for r in proxy.log
        if r.fault == "delay" and r.upstream == 200 and "SET #owner = :me" in r.body.get("UpdateExpression", "")
    ]


def run_mixed_faults(endpoint_url: str, kind: str, tmp_path, shape) -> Run:
    workers, keys, clean_s, faulty_s = shape
    with Scenario(
        endpoint_url,
        tmp_path,
        workers,
        [f"k{i}" for i in range(keys)],
        assign="fixed",
        record=True,
        hold=0.005,
        lease=LEASE,
        heartbeat=1.0,
        read_timeout=0.25,
        connect_timeout=0.5,
        wait=10.0,
        max_seconds=clean_s + faulty_s + 120,
    ) as sc:
        sc.fleet.start()
        sc.fleet.release()
        time.sleep(1.0)  # connections up, first handoffs done
        clean = (time.time(), time.time() + clean_s)
        time.sleep(clean_s)
        sc.proxies.set_rates(MIXED_FAULTS, delay_seconds=FAULT_DELAY)
        faulty_start = time.time()
        time.sleep(faulty_s)
        sc.proxies.set_rates({})
        faulty = (faulty_start, time.time())
        counts = sc.proxies.counts()
        sc.fleet.stop()
        assert sc.proxies.errors() == []
        return Run(
            kind,
            sc.fleet.results(),
            clean,
            faulty,
            {k: v for k, v in counts.items() if k not in ("requests", "forwarded")},
            counts["requests"],
            late_duplicates(sc.proxies),
        )


def run_for(request, tmp_path_factory, shape) -> Run:
    kind = request.param
    server = request.getfixturevalue(f"{kind.replace('-', '_')}_server")
    run = run_mixed_faults(server.endpoint_url, kind, tmp_path_factory.mktemp(f"mixed-{kind}"), shape)
    print("\n" + run.describe())
    return run


@pytest.fixture(scope="module")
def mixed_run(request, tmp_path_factory) -> Run:
    """One run per server (``indirect`` parameter), shared by the tests below."""
    return run_for(request, tmp_path_factory, DEFAULT)


@pytest.fixture(scope="module")
def soak_run(request, tmp_path_factory) -> Run:
    return run_for(request, tmp_path_factory, LONG)


def check_no_violation(run: Run, minimum_sections: int) -> None:
    result = run.results
    assert result.violations == [], summarize(result.sections, result.violations)
    assert len(result.sections) >= minimum_sections, run.describe()
    assert all(run.faults.get(kind, 0) >= 10 for kind in MIXED_FAULTS), run.describe()
    # Every section wrote: with a lease of 4 s and sections of 5 ms, no lease should end mid-section.
    assert result.wrote() == len(result.sections), run.describe()
    assert sum(result.counters.values()) == result.wrote()


def check_throughput(run: Run) -> None:
    # Keys left idle for a whole lease are reported by describe(), not asserted: a release
    # whose three quick tries all fail (about 4 in 10 000 at these rates, by design: see
    # docs/reliability.md) leaves its key to be taken over after a lease. The late-request
    # bugs that used to idle keys far more often have exact tests in test_late_requests.py.
    assert run.ratio >= 1 / 3, run.describe()


@pytest.mark.parametrize("mixed_run", SERVERS, indirect=True)
def test_no_violation_with_or_without_faults(mixed_run):
    check_no_violation(mixed_run, minimum_sections=500)


@pytest.mark.parametrize("mixed_run", SERVERS, indirect=True)
def test_contended_throughput_under_faults_is_a_third_of_fault_free(mixed_run):
    check_throughput(mixed_run)


@pytest.mark.soak
@pytest.mark.parametrize("soak_run", SERVERS, indirect=True)
def test_soak_no_violation_with_or_without_faults(soak_run):
    check_no_violation(soak_run, minimum_sections=2000)


@pytest.mark.soak
@pytest.mark.parametrize("soak_run", SERVERS, indirect=True)
def test_soak_contended_throughput_under_faults_is_a_third_of_fault_free(soak_run):
    check_throughput(soak_run)
