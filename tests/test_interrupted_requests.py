"""An exception the caller's own code raises into a request (issue 36, D2 and N1).

A process' main thread is interrupted while the reply of its write is held back by the
fault proxy, after the write has landed: SIGINT (KeyboardInterrupt, a BaseException) or
SIGUSR1, whose handler raises billiard's SoftTimeLimitExceeded (an Exception, which
botocore wraps in HTTPClientError), as at a Celery task's soft time limit. The exception
must reach the caller, unchanged, and never leave a key held by nobody: an acquire's
landed write is undone, an interrupted extend is rolled back to the lease's own terms.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import signal
import ssl
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import urllib3.exceptions
from billiard.exceptions import SoftTimeLimitExceeded
from botocore.exceptions import HTTPClientError

from django_dynlock.engine.failures import raised_into
from localdynamo.faultproxy import FaultProxy
from localdynamo.servers import dummy_client
from tests.support import interrupt_child as child_module
from tests.support.clients import client_for
from tests.support.polling import wait_for

SIGNALS = {"KeyboardInterrupt": signal.SIGINT, "SoftTimeLimitExceeded": signal.SIGUSR1}
HELD_FOR = 15.0  # seconds the proxy holds the reply back: far past the checks below


def is_acquire(body: dict[str, Any]) -> bool:
    return "SET #owner = :me" in body.get("UpdateExpression", "")


def is_release(body: dict[str, Any]) -> bool:
    return "REMOVE #owner" in body.get("UpdateExpression", "") and ":me" in body.get("ExpressionAttributeValues", {})


def is_extend(body: dict[str, Any]) -> bool:
    lease_ms = body.get("ExpressionAttributeValues", {}).get(":lease_ms", {}).get("N")
    return lease_ms == str(int(child_module.EXTENDED * 1000)) and not is_acquire(body)


def hold_reply(proxy: FaultProxy, operation: str, transactions: bool, seconds: float = HELD_FOR):
    if operation == "acquire_many" and transactions:
        return proxy.add_fault("delay_reply", operation="TransactWriteItems", delay_seconds=seconds)
    # Without transactions (dynalite) acquire_many's first key is acquired alone.
    match = {"acquire": is_acquire, "acquire_many": is_acquire, "release": is_release, "extend": is_extend}
    return proxy.add_fault("delay_reply", operation="UpdateItem", match=match[operation], delay_seconds=seconds)


@pytest.mark.parametrize("exception", sorted(SIGNALS))
@pytest.mark.parametrize("operation", ["acquire", "acquire_many", "release", "extend"])
def test_an_exception_raised_into_a_request_reaches_the_caller_and_leaves_no_key_held_by_nobody(
    dynlock, tmp_path, operation, exception
):
    table = dynlock.options.table_name
    direct = dummy_client(dynlock.server.endpoint_url)

    def item(key: str) -> dict[str, Any]:
        found: dict[str, Any] = direct.get_item(TableName=table, Key={"key": {"S": key}}, ConsistentRead=True).get(
            "Item", {}
        )
        return found

    def landed() -> bool:
        if operation in ("acquire", "acquire_many"):
            return "owner" in item("interrupted" if operation == "acquire" else "group:1")
        if operation == "release":
            return "owner" not in item("interrupted") and "released_at" in item("interrupted")
        return item("interrupted").get("lease_ms", {}).get("N") == str(int(child_module.EXTENDED * 1000))

    report, stop = tmp_path / "report.json", tmp_path / "stop"
    with FaultProxy(dynlock.server.endpoint_url, max_seconds=90) as proxy:
        held = hold_reply(proxy, operation, transactions=getattr(dynlock.server, "kind", "") != "dynalite")
        child = subprocess.Popen(
            [sys.executable, "-m", "tests.support.interrupt_child", operation, proxy.endpoint_url, table]
            + [str(report), str(stop)],
            cwd=Path(__file__).resolve().parent.parent,
        )
        try:
            wait_for(lambda: held.fired and landed(), 30, "the write to land, its reply held back")
            interrupted = time.monotonic()
            child.send_signal(SIGNALS[exception])
            outcome = json.loads(wait_for(lambda: report.exists() and report.read_text(), 10, "the child's report"))
            took = time.monotonic() - interrupted
            assert outcome.get("raised") == exception, outcome  # not retried as the network's failure
            if exception == "SoftTimeLimitExceeded":
                assert outcome["unchanged"], outcome  # the handler's own exception, not a wrapper
            assert took < HELD_FOR / 2, took  # the caller did not wait for the held reply
            if operation == "extend":
                assert outcome["held"], outcome
                # Back to the lease's own 30 s at once (the next renewal was 10 s away).
                wait_for(
                    lambda: item("interrupted").get("lease_ms", {}).get("N") == str(int(child_module.LEASE * 1000)),
                    3,
                    "the interrupted extend to be rolled back",
                )
            else:
                keys = child_module.GROUP if operation == "acquire_many" else [child_module.KEY]
                for key in keys:
                    # Free now, not in 30 s when the lease of a write nobody holds runs out.
                    lease = dynlock.try_acquire(key)
                    assert lease is not None, (key, item(key))
                    lease.release()
            stop.touch()
            assert child.wait(15) == 0
        finally:
            stop.touch()
            if child.poll() is None:
                child.kill()
                child.wait(5)
            direct.close()
        assert proxy.errors == []


@pytest.mark.parametrize("operation", ["acquire", "acquire_many"])
def test_a_cancelled_async_acquire_whose_write_landed_leaves_no_key_held_by_nobody(dynlock, operation):
    """The async path drives the same steps: a cancellation while the reply of a landed
    write is held back waits for the request to end, then undoes it."""
    table = dynlock.options.table_name
    keys = child_module.GROUP if operation == "acquire_many" else [child_module.KEY]
    direct = dummy_client(dynlock.server.endpoint_url)
    with FaultProxy(dynlock.server.endpoint_url, max_seconds=60) as proxy:
        client = client_for(
            proxy.endpoint_url,
            table,
            lease_duration=child_module.LEASE,
            heartbeat_period=10.0,
            client_config={"read_timeout": 20, "connect_timeout": 2},
        )
        held = hold_reply(proxy, operation, getattr(dynlock.server, "kind", "") != "dynalite", seconds=2.0)

        def landed() -> bool:
            item = direct.get_item(TableName=table, Key={"key": {"S": keys[0]}}, ConsistentRead=True).get("Item", {})
            return bool(held.fired) and "owner" in item

        async def main() -> None:
            acquiring = asyncio.create_task(
                client.acquire_many_async(keys, wait=10)
                if operation == "acquire_many"
                else client.acquire_async(keys[0], wait=10)
            )
            deadline = time.monotonic() + 20
            while not landed():
                assert time.monotonic() < deadline and not acquiring.done(), "the write did not land"
                await asyncio.sleep(0.02)
            acquiring.cancel()
            with pytest.raises(asyncio.CancelledError):
                await acquiring

        try:
            asyncio.run(asyncio.wait_for(main(), 30))
            for key in keys:
                lease = dynlock.try_acquire(key)
                assert lease is not None, key
                lease.release()
        finally:
            client.close()
            direct.close()
        assert proxy.errors == []


@pytest.mark.parametrize(
    "cause, callers",
    [
        (SoftTimeLimitExceeded("soft time limit (0.1s) exceeded"), True),
        (RuntimeError("raised by a signal handler"), True),
        (ConnectionResetError(104, "reset"), False),
        (TimeoutError("timed out"), False),
        (ssl.SSLError("bad record mac"), False),
        (http.client.RemoteDisconnected("closed"), False),
        (urllib3.exceptions.ProtocolError("aborted"), False),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, BaseException) else str(value),
)
def test_only_a_transport_error_wrapped_by_botocore_is_the_networks(cause, callers):
    wrapped = HTTPClientError(error=cause)
    assert raised_into(wrapped) is (cause if callers else None)
    assert raised_into(cause) is None  # not wrapped: nothing to unwrap
