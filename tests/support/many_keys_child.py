"""Many keys: a holder that dies without releasing them, and a client that tries them
round-robin (tests/test_forgotten_watches.py).

    python -m tests.support.many_keys_child hold ENDPOINT TABLE KEYS LEASE REPORT
    python -m tests.support.many_keys_child take ENDPOINT TABLE KEYS LEASE REPORT SECONDS HOLDER_REPORT

``hold`` acquires KEYS keys (``k0`` ... ``k<KEYS-1>``), a hundred to a transaction, then
exits at once (``os._exit``: no release, no heartbeat after). Every line of REPORT is
``WROTE key t``: the true wall time at which a successful write to that key was sent
(an acquire's transaction, or a renewal by the heartbeat while the others were
acquired), so that the test knows each key's last write; ``DONE`` at the end.

``take`` starts beside the holder, so that its start-up is not timed: once HOLDER_REPORT
says ``DONE`` it tries every key not yet taken with ``try_acquire``, eight at a time, round after
round, for at most SECONDS: ``FIRST key t`` (the true wall time of its first call on the
key), ``TAKEN key before after`` (true wall times around the call
that took it), ``BUSY key before`` (a call that found it busy), ``ROUND seconds`` after each round, and ``REMEMBERED n`` (the watches its
client kept in memory) at the end. It holds what it takes for a minute, unrenewed: the
renewals or releases of 1,100 leases would slow the rounds the test times.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from tests.support.clients import client_for
from tests.support.wallclock import true_wall


def hold(client, names: list[str], report) -> None:
    lock = threading.Lock()
    local = threading.local()

    def before_call(params, **_):
        local.sent = time.monotonic()
        if "TransactItems" in params:
            local.keys = [op["Update"]["Key"]["key"]["S"] for op in params["TransactItems"] if "Update" in op]
        else:
            local.keys = [params["Key"]["key"]["S"]]

    def after_call(http_response, parsed, **_):
        if http_response.status_code == 200 and "Error" not in parsed:
            with lock:
                for key in local.keys:
                    report.write(f"WROTE {key} {true_wall(local.sent):.6f}\n")

    for operation in ("UpdateItem", "TransactWriteItems"):
        client.boto.meta.events.register(f"before-parameter-build.dynamodb.{operation}", before_call)
        client.boto.meta.events.register(f"after-call.dynamodb.{operation}", after_call)
    for start in range(0, len(names), 100):
        client.acquire_many(names[start : start + 100], wait=10)
    report.write("DONE\n")
    report.flush()
    os._exit(0)


def take(client, names: list[str], report, seconds: float, holder_report: str) -> None:
    ready = time.monotonic() + 60
    with open(holder_report) as holder:
        while "DONE" not in holder.read() and time.monotonic() < ready:
            time.sleep(0.01)
            holder.seek(0)
    taken: set[str] = set()
    looked: set[str] = set()
    lock = threading.Lock()

    def try_one(key: str) -> None:
        before = true_wall()
        if key not in looked:
            looked.add(key)  # one thread per key at a time: no race on this key
            report.write(f"FIRST {key} {before:.6f}\n")
        if client.try_acquire(key, lease=60.0) is not None:
            with lock:
                taken.add(key)
                report.write(f"TAKEN {key} {before:.6f} {true_wall():.6f}\n")
        else:
            report.write(f"BUSY {key} {before:.6f}\n")

    deadline = time.monotonic() + seconds
    with ThreadPoolExecutor(max_workers=8) as pool:
        for _ in range(200):
            if len(taken) == len(names) or time.monotonic() >= deadline:
                break
            began = time.monotonic()
            list(pool.map(try_one, [key for key in names if key not in taken]))
            report.write(f"ROUND {time.monotonic() - began:.3f}\n")
    report.write(f"REMEMBERED {len(client._waiting._watches)}\n")
    report.flush()
    os._exit(0)  # no release of what it took: the table is dropped after


def main(
    role: str, endpoint: str, table: str, keys: str, lease: str, report_path: str, seconds: str = "30", holder: str = ""
) -> None:
    lease_s = float(lease)
    client = client_for(endpoint, table, lease_duration=lease_s, heartbeat_period=lease_s / 4)
    report = open(report_path, "a", buffering=1)
    names = [f"k{i}" for i in range(int(keys))]
    if role == "hold":
        hold(client, names, report)
    else:
        take(client, names, report, float(seconds), holder)


if __name__ == "__main__":
    main(*sys.argv[1:])
