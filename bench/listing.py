"""Listing many live leases: ``LockClient.leases()`` and the admin's changelist page.

The table is filled with BatchWriteItem (25 items a request) with items shaped like
the engine's own (the attributes ``_acquire_request`` writes, with a lease of an hour
so that all of them are live). Then, each repeated and the median taken:

- ``list(client.leases())``: the library's paginated Scan (the server's 1 MB pages,
  filter ``attribute_exists(owner)``), parsed into LeaseInfo;
- the raw boto3 floor: the same Scan calls (no Limit, same filter), no parsing;
- a raw Scan of 100-item pages (``Limit=100``, same filter), no parsing: what the
  page size costs (``leases(page_size=100)`` sends these);
- the admin changelist's first page: GET with Django's test client, as a logged-in
  superuser, in a child process (``python -m bench.admin_page``) running the demo
  project's settings with DYNLOCK pointed at the server.

python-dynamodb-lock and dyndbmutex have no listing API (only a raw Scan of their
tables would do), so they have no row here.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from bench.children import BenchError
from bench.clients import boto_session, make_client
from bench.stats import median
from django_dynlock.engine import items as it

LIST_TABLE = "dynlock_bench_list"
PREFIX = "list-"


def _boto(endpoint_url: str, read_timeout: float = 60.0) -> Any:
    from botocore.config import Config

    return boto_session().client(
        "dynamodb",
        endpoint_url=endpoint_url,
        config=Config(
            connect_timeout=2, read_timeout=read_timeout, retries={"mode": "standard", "total_max_attempts": 3}
        ),
    )


def lease_item(i: int, now: float) -> dict[str, Any]:
    """One live lease, attribute for attribute what the engine's acquire writes."""
    lease = 3600.0
    return {
        "key": {"S": f"{PREFIX}{i:06d}"},
        it.OWNER: {"S": f"benchhost:{1000 + i % 7}:{uuid.uuid4().hex[:8]}:{uuid.uuid4().hex[:12]}"},
        it.RVN: {"S": uuid.uuid4().hex},
        it.FENCE: {"N": str(int(now * 1_000_000) + 1)},
        it.LEASE_MS: {"N": str(int(lease * 1000))},
        it.EXPIRES_AT: {"N": repr(round(now + lease, 6))},
        it.ACQUIRED_AT: {"N": repr(round(now, 6))},
        it.HOST: {"S": "benchhost"},
        it.PID: {"N": str(1000 + i % 7)},
        it.THREAD: {"S": "MainThread"},
        it.HOLDER: {"M": {"view": {"S": f"bench.view_{i % 13}"}}},
        "gc_at": {"N": str(int(now + lease + 604800) + 1)},
    }


def fill(endpoint_url: str, count: int, threads: int = 4, cap: float = 180.0) -> dict[str, Any]:
    boto = _boto(endpoint_url)
    now = time.time()
    batches = [list(range(b, min(count, b + 25))) for b in range(0, count, 25)]
    errors: list[str] = []
    lock = threading.Lock()
    stop_at = time.monotonic() + cap

    def worker(mine: list[list[int]]) -> None:
        try:
            for batch in mine:
                if time.monotonic() >= stop_at:
                    raise BenchError("filling the table took too long")
                request = {LIST_TABLE: [{"PutRequest": {"Item": lease_item(i, now)}} for i in batch]}
                for _ in range(10):  # unprocessed items, re-sent a bounded number of times
                    reply = boto.batch_write_item(RequestItems=request)
                    request = reply.get("UnprocessedItems") or {}
                    if not request:
                        break
                    time.sleep(0.05)
                else:
                    raise BenchError("BatchWriteItem kept returning unprocessed items")
        except Exception as exc:
            with lock:
                errors.append(f"{type(exc).__name__}: {exc}")

    began = time.monotonic()
    workers = [threading.Thread(target=worker, args=(batches[i::threads],), daemon=True) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(cap + 30)
    boto.close()
    if errors:
        raise BenchError(errors[0])
    return {"items": count, "seconds": time.monotonic() - began, "requests": len(batches)}


def _timed(fn: Callable[[], tuple[int, int]]) -> dict[str, Any]:
    """One timed run of ``fn`` (which returns rows, calls)."""
    t0 = time.perf_counter()
    rows, calls = fn()
    return {"seconds": time.perf_counter() - t0, "rows": rows, "calls": calls}


def measure_listing(
    endpoint_url: str, count: int, repeats: int, cap: float, admin_gets: int, say: Callable[[str], None]
) -> dict[str, Any]:
    setup = make_client(endpoint_url, table_name=LIST_TABLE)
    try:
        setup.create_table(wait=True)
    finally:
        setup.close()
    out: dict[str, Any] = {"leases": count, "fill": fill(endpoint_url, count)}
    say(f"    filled {count} leases in {out['fill']['seconds']:.1f}s")

    # leases() may take long on moto (it rescans from the start for every page):
    # a longer read timeout than the engine's lease-friendly 2 s.
    from django_dynlock.engine.options import merge_client_config

    client = make_client(endpoint_url, table_name=LIST_TABLE, client_config=merge_client_config({"read_timeout": 60}))
    counted: dict[str, int] = {"n": 0}
    client.boto.meta.events.register(
        "before-call.dynamodb", lambda **_: counted.__setitem__("n", counted["n"] + 1), unique_id="bench-list-count"
    )
    raw = _boto(endpoint_url)

    def library() -> tuple[int, int]:
        counted["n"] = 0
        n = len(list(client.leases()))
        return n, counted["n"]

    def raw_scan(**page: Any) -> tuple[int, int]:
        """Rows and Scan calls of one paginated raw scan of the whole table."""
        rows = pages = 0
        start = None
        for _ in range(100_000):
            params: dict[str, Any] = {"TableName": LIST_TABLE, "ConsistentRead": True, **page}
            if start:
                params["ExclusiveStartKey"] = start
            reply = raw.scan(**params)
            pages += 1
            rows += len(reply.get("Items", []))
            start = reply.get("LastEvaluatedKey")
            if not start:
                break
        return rows, pages

    live = {"FilterExpression": "attribute_exists(#owner)", "ExpressionAttributeNames": {"#owner": it.OWNER}}

    def floor_same_pages() -> tuple[int, int]:
        return raw_scan(**live)

    def floor_100_pages() -> tuple[int, int]:
        return raw_scan(Limit=100, **live)

    try:
        # Interleaved, so that drift in the machine's load hits all three alike.
        variants = {"library": library, "floor_same_pages": floor_same_pages, "floor_100_pages": floor_100_pages}
        results: dict[str, list[dict[str, Any]]] = {name: [] for name in variants}
        began = time.monotonic()
        for _ in range(repeats):
            round_began = time.monotonic()
            for name, fn in variants.items():
                results[name].append(_timed(fn))
            # Another round only if it would still end within the cap (moto takes ~1 minute a round).
            if time.monotonic() + (time.monotonic() - round_began) - began > cap:
                break
        for name, runs in results.items():
            times = [r["seconds"] for r in runs]
            out[name] = {
                "seconds": times,
                "median_s": median(times),
                "rows": runs[-1]["rows"],
                "calls": runs[-1]["calls"],
            }
            if out[name]["rows"] != count:
                raise BenchError(f"{name} listed {out[name]['rows']} of {count} leases")
    finally:
        client.close()
        raw.close()
    say(f"    leases(): {out['library']['median_s']:.2f}s, floor {out['floor_same_pages']['median_s']:.2f}s")
    out["admin"] = measure_admin(endpoint_url, admin_gets)
    return out


def measure_admin(endpoint_url: str, gets: int) -> dict[str, Any]:
    """The changelist's first page, timed in a child process (Django set up there)."""
    from localdynamo.servers import REPO_ROOT, server_env

    env = server_env({"PYTHONPATH": str(REPO_ROOT)})
    env.pop("AWS_ENDPOINT_URL_DYNAMODB", None)
    env.pop("DJANGO_SETTINGS_MODULE", None)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "bench.admin_page", endpoint_url, LIST_TABLE, str(gets)],
            cwd=str(REPO_ROOT),
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
    except subprocess.TimeoutExpired:
        return {"error": "admin page timing did not finish within 180 s"}
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-6:])
        return {"error": f"exit {proc.returncode}: {tail}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


__all__ = ["measure_listing", "measure_admin", "LIST_TABLE"]
