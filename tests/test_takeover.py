"""No stuck keys, and no host's clock trusted: takeover by DynamoDB's clock, across processes.

Each scenario runs real processes (``tests/support/takeover_child.py``) against a real server:
a holder that is killed with SIGKILL, or kept alive, and takers that are fresh
one-shot processes (a cron job, a new worker) or one process retrying every 0.2 s.
Some have their wall clock shifted by a minute. All report true wall times, so the
test can check both promises:

- safety: no taker's winning write was sent before the holder stopped trusting its
  lease (its last successful write + lease - margin), and a live holder, whatever the
  clocks, is never taken over;
- liveness: a dead holder's key is taken within lease + 3 s of its last successful write.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from localdynamo.servers import REPO_ROOT
from tests.reliability.harness import create_table
from tests.support.polling import wait_for
from tests.support.tables import delete_table

pytestmark = pytest.mark.slow

LEASE = 2.0
MARGIN = 0.1 * LEASE
BOUND = LEASE + 3.0  # the promise: taken within lease + 3 s of the last successful write


class Scenario:
    def __init__(self, server, tmp_path: Path):
        self.endpoint = server.endpoint_url
        self.table = create_table(self.endpoint)
        self.dir = tmp_path
        self.children: list[subprocess.Popen] = []

    def start(
        self,
        role: str,
        name: str,
        *,
        offset: float = 0.0,
        seconds: float = 30.0,
        key: str = "k",
        endpoint: str | None = None,
        lease: float = LEASE,
    ) -> Path:
        report = self.dir / f"{name}.txt"
        report.touch()
        child = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.support.takeover_child",
                role,
                endpoint or self.endpoint,
                self.table,
                key,
                str(lease),
                str(offset),
                str(report),
                str(seconds),
            ],
            cwd=REPO_ROOT,
        )
        self.children.append(child)
        return report

    def run_once(self, name: str, *, offset: float = 0.0) -> list[list[str]]:
        report = self.start("try", name, offset=offset)
        self.children[-1].wait(60)
        return lines(report)

    def holder(self, *, offset: float = 0.0, endpoint: str | None = None) -> tuple[subprocess.Popen, Path]:
        report = self.start("hold", "holder", offset=offset, seconds=60, endpoint=endpoint)
        wait_for(lambda: any(w[0] == "WROTE" for w in lines(report)[1:]), 60, "the holder to renew once")
        return self.children[-1], report

    def close(self) -> None:
        for child in self.children:
            if child.poll() is None:
                child.kill()
                child.wait(10)
        delete_table(self.endpoint, self.table)


def lines(report: Path) -> list[list[str]]:
    return [line.split() for line in report.read_text().splitlines() if line.strip()]


def last_write(report: Path) -> float:
    return max(float(w[1]) for w in lines(report) if w[0] == "WROTE")


def winning_send(report: Path) -> float | None:
    return winning_send_of(lines(report))


def winning_send_of(words: list[list[str]]) -> float | None:
    """The send time of the write that took the key: the last success before GOT."""
    sent = None
    for line in words:
        if line[0] == "SENT":
            sent = float(line[1])
        if line[0] == "GOT":
            return sent
    return None


@pytest.fixture
def scenario(server, tmp_path):
    made = Scenario(server, tmp_path)
    yield made
    made.close()


def kill(child: subprocess.Popen) -> None:
    child.send_signal(signal.SIGKILL)
    child.wait(10)


def assert_never_taken_while_live(taker_report: Path, holder_report: Path) -> None:
    """A taker that kept trying got nothing, and the live holder never stopped believing in its lease."""
    assert winning_send(taker_report) is None, "a live holder was taken over"
    assert sum(1 for w in lines(taker_report) if w[0] == "BUSY") >= 10
    beliefs = [w[0] for w in lines(holder_report) if w[0] in ("HELD", "LOST")]
    assert beliefs and set(beliefs) == {"HELD"}, "the holder stopped believing in its live lease"


def assert_taken_in_time(holder_report: Path, taken_at: float | None) -> None:
    assert taken_at is not None, "nobody took the dead holder's key"
    last = last_write(holder_report)
    assert taken_at >= last + LEASE - MARGIN, f"taken {taken_at - last:.2f}s after its last write: too early"
    assert taken_at - last <= BOUND, f"taken {taken_at - last:.2f}s after its last write: more than lease + 3 s"
    print(f"\ntaken over {taken_at - last:.2f}s after the dead holder's last write (lease {LEASE}s)")


@pytest.mark.parametrize("holder_offset", [0.0, 60.0], ids=["true-clock", "holder-60s-ahead"])
def test_fresh_one_shot_processes_take_over_a_killed_holder(scenario, holder_offset):
    holder, report = scenario.holder(offset=holder_offset)
    kill(holder)
    taken_at = None
    refused: list[float] = []  # when each process that found the key busy sent its write
    for attempt in range(40):  # each a fresh process: about 0.5 s apart on an idle machine
        words = scenario.run_once(f"try{attempt}")
        taken_at = winning_send_of(words)
        if taken_at is not None:
            break
        refused += [float(w[1]) for w in words if w[0] == "TRIED"]
    assert taken_at is not None, "nobody took the dead holder's key"
    last = last_write(report)
    assert taken_at >= last + LEASE - MARGIN, f"taken {taken_at - last:.2f}s after its last write: too early"
    # The promise, whatever the pace at which a loaded machine starts processes (one took
    # 5.5 s in a CI run beside other work): no write sent lease + 3 s after the holder's
    # last one finds the key busy.
    late = [round(sent - last, 2) for sent in refused if sent - last > BOUND]
    assert not late, f"refused {late} s after the holder's last write: more than lease + 3 s"
    print(f"\ntaken over {taken_at - last:.2f}s after the dead holder's last write (lease {LEASE}s)")


def retrying(scenario: Scenario, *, offset: float = 0.0) -> Path:
    """A process retrying every 200 ms, once it has found the key busy: it is retrying when
    the holder dies. Started after the kill, its start-up (4-7 s at load 9, beside other
    test runs) counted against the takeover's bound, and it took the key at its first write."""
    report = scenario.start("retry", "retrier", offset=offset, seconds=LEASE + 30)
    wait_for(lambda: any(w[0] == "BUSY" for w in lines(report)), 60, "the retrier to find the key busy")
    return report


def test_a_process_retrying_every_200ms_takes_over_a_killed_holder(scenario):
    holder, report = scenario.holder()
    retrier = retrying(scenario)
    kill(holder)
    scenario.children[-1].wait(60)
    assert_taken_in_time(report, winning_send(retrier))


@pytest.mark.parametrize(
    "holder_offset, taker_offset", [(0.0, 60.0), (-60.0, 0.0)], ids=["taker-60s-ahead", "holder-60s-behind"]
)
def test_a_live_holder_is_never_taken_over_whatever_the_clocks(scenario, holder_offset, taker_offset):
    holder, report = scenario.holder(offset=holder_offset)
    taker = scenario.start("retry", "taker", offset=taker_offset, seconds=3 * LEASE)
    scenario.children[-1].wait(60)
    assert_never_taken_while_live(taker, report)
    # And once the holder dies, the same skewed taker gets the key in time.
    retrier = retrying(scenario, offset=taker_offset)
    kill(holder)
    scenario.children[-1].wait(60)
    assert_taken_in_time(report, winning_send(retrier))
