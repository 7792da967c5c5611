"""One process whose main thread is interrupted while a write's reply is on its way
(tests/test_interrupted_requests.py).

    python -m tests.support.interrupt_child OPERATION ENDPOINT TABLE REPORT STOP

OPERATION is ``acquire`` (key ``interrupted``), ``acquire_many`` (``group:1`` and
``group:2``), ``release`` or ``extend`` (of a lease of ``interrupted`` acquired first,
to 60 s). The test's fault proxy at ENDPOINT holds back the reply of that operation's
write, and the test interrupts this process then: SIGINT raises KeyboardInterrupt
(Python's own handler), SIGUSR1 raises billiard's SoftTimeLimitExceeded (an Exception),
as a Celery pool process' handler does at a task's soft time limit.

Writes one JSON line to REPORT: what the operation raised (its class, and whether it is
the very exception the handler raised) or returned, and whether the lease acquired
first is still held. Then waits (at most 30 s) for the file STOP, releases what it
holds, and exits. Every wait is bounded.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

from billiard.exceptions import SoftTimeLimitExceeded

from tests.support.clients import client_for

KEY = "interrupted"
GROUP = ["group:1", "group:2"]
LEASE = 30.0
EXTENDED = 60.0

raised: list[BaseException] = []


def soft_time_limit(signum: int, frame: Any) -> None:
    exc = SoftTimeLimitExceeded("soft time limit (0.1s) exceeded")
    raised.append(exc)
    raise exc


def main(operation: str, endpoint: str, table: str, report: str, stop: str) -> None:
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if the test runner ignores SIGINT
    signal.signal(signal.SIGUSR1, soft_time_limit)
    # Long enough for the held reply; a renewal every 10 s, none during the test's checks.
    config = {"read_timeout": 20, "connect_timeout": 2}
    client = client_for(endpoint, table, lease_duration=LEASE, heartbeat_period=10.0, client_config=config)
    outcome: dict[str, Any] = {}
    held: list[Any] = []
    try:
        first = client.acquire(KEY, wait=10) if operation in ("release", "extend") else None
        try:
            if operation == "acquire":
                held.append(client.acquire(KEY, wait=10))
            elif operation == "acquire_many":
                held.append(client.acquire_many(GROUP, wait=10))
            elif operation == "release":
                assert first is not None
                first.release()
            else:
                assert first is not None
                first.extend(EXTENDED)
            outcome["returned"] = True
        except BaseException as exc:  # noqa: BLE001 (what reaches the caller is the point)
            outcome["raised"] = type(exc).__name__
            outcome["unchanged"] = bool(raised) and exc is raised[-1]
        if first is not None:
            outcome["held"] = first.is_held
            if first.is_held:
                held.append(first)
        Path(report).write_text(json.dumps(outcome) + "\n")
        deadline = time.monotonic() + 30
        while not Path(stop).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        for lease in held:
            lease.release()
    finally:
        client.close()


if __name__ == "__main__":
    main(*sys.argv[1:6])
