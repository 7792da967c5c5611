"""One fresh process of the takeover scenarios (tests/test_takeover.py).

    python -m tests.support.takeover_child ROLE ENDPOINT TABLE KEY LEASE OFFSET REPORT [SECONDS] [INTERVAL]

ROLE is ``hold`` (acquire, renew, report beliefs until killed or SECONDS pass),
``try`` (one try_acquire, as a cron job or a fresh worker would), ``retry``
(try_acquire every INTERVAL seconds for up to SECONDS), ``wait`` (one acquire
that waits up to SECONDS) or ``adopt`` (adopt the handover whose ``as_dict()`` is
KEY, as JSON, then report beliefs like ``hold``; ``ADOPTED token`` or ``REFUSED reason``). OFFSET shifts this whole
process' wall clock (``time.time``/``time_ns``, which botocore and the engine read)
by that many seconds; its monotonic clock is untouched, as on a host whose clock is
wrong. Every line of REPORT carries the *true* wall time, so that the test can
compare processes: ``ACQUIRED token``, ``WROTE t`` (the send time of each successful
write of the holder), ``HELD t``/``LOST t`` (the holder's belief, every 10 ms),
``GOT token t`` (the send time of the write that took the key) or ``BUSY t``.
Every loop is bounded.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

from django_dynlock.engine import Handover
from django_dynlock.exceptions import DynLockError, LockNotAcquired
from tests.support.clients import client_for
from tests.support.wallclock import shift_wall_clock, true_wall


class Report:
    def __init__(self, path: str):
        self._file = open(path, "a", buffering=1)
        self._lock = threading.Lock()

    def line(self, *words: object) -> None:
        with self._lock:
            self._file.write(" ".join(map(str, words)) + "\n")


def track_writes(client, report: Report, label: str) -> None:
    """Report the true send time of each UpdateItem: ``label`` when it succeeded, ``TRIED``
    when it did not (a failed condition: the key was busy)."""
    local = threading.local()

    def before_send(**_):
        local.sent = time.monotonic()

    def after_call(http_response, parsed, **_):
        ok = http_response.status_code == 200 and "Error" not in parsed
        report.line(label if ok else "TRIED", f"{true_wall(local.sent):.6f}")

    client.boto.meta.events.register("before-send.dynamodb.UpdateItem", before_send)
    client.boto.meta.events.register("after-call.dynamodb.UpdateItem", after_call)


def main(
    role: str,
    endpoint: str,
    table: str,
    key: str,
    lease: str,
    offset: str,
    report_path: str,
    seconds: str = "30",
    interval: str = "0.2",
) -> None:
    shift_wall_clock(float(offset))

    lease_s = float(lease)
    client = client_for(endpoint, table, lease_duration=lease_s, heartbeat_period=lease_s / 4)
    report = Report(report_path)
    deadline = time.monotonic() + float(seconds)
    if role in ("hold", "adopt"):
        track_writes(client, report, "WROTE")
        if role == "hold":
            held = client.acquire(key, wait=10)
            report.line("ACQUIRED", held.token)
        else:
            try:
                held = client.adopt(Handover.from_dict(json.loads(key)), lease=lease_s)
            except DynLockError as exc:
                report.line("REFUSED", getattr(exc, "reason", type(exc).__name__))
                os._exit(0)
            report.line("ADOPTED", held.token)
        while time.monotonic() < deadline:
            report.line("HELD" if held.is_held else "LOST", f"{true_wall():.6f}")
            time.sleep(0.01)
        os._exit(0)
    track_writes(client, report, "SENT")
    if role == "wait":
        try:
            got = client.acquire(key, wait=float(seconds))
        except LockNotAcquired:
            report.line("BUSY", f"{true_wall():.6f}")
        else:
            report.line("GOT", got.token)
            got.release()
        client.close()
        return
    for _ in range(int(float(seconds) / float(interval)) + 1 if role == "retry" else 1):
        got = client.try_acquire(key)
        if got is not None:
            report.line("GOT", got.token)
            got.release()
            break
        report.line("BUSY", f"{true_wall():.6f}")
        if role != "retry" or time.monotonic() >= deadline:
            break
        time.sleep(float(interval))
    client.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
