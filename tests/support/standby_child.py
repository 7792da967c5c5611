"""The program ``runlocked --standby --exec`` runs in tests/commands/test_standby.py.

Appends one JSON line per event to a report shared by every child: ``start``, a
``tick`` every 50 ms, ``stop`` on SIGTERM (then exits 0, unless ``--ignore-term``),
with ``time.monotonic()``, one clock for every process of the machine on Linux. Only
the standard library: it starts in a few tens of milliseconds. Ends by itself after
``--life`` seconds (exit ``--code``), or after 120 s at the latest.

    python tests/support/standby_child.py REPORT [--life SECONDS] [--code N] [--ignore-term]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("report")
    parser.add_argument("--life", type=float, default=120.0)
    parser.add_argument("--code", type=int, default=0)
    parser.add_argument("--ignore-term", action="store_true")
    options = parser.parse_args()
    # One write per line, in append mode: lines of several processes never interleave.
    out = os.open(options.report, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def log(event: str, **extra: object) -> None:
        line = {"pid": os.getpid(), "event": event, "at": time.monotonic(), **extra}
        os.write(out, (json.dumps(line) + "\n").encode())

    def on_term(signum: int, frame: object) -> None:
        log("stop" if not options.ignore_term else "ignored")
        if not options.ignore_term:
            os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    log("start", token=os.environ.get("DYNLOCK_TERM_TOKEN"), election=os.environ.get("DYNLOCK_ELECTION"))
    end = time.monotonic() + min(options.life, 120.0)
    while time.monotonic() < end:
        log("tick")
        time.sleep(0.05)
    log("end")
    os._exit(options.code)


if __name__ == "__main__":
    main()
