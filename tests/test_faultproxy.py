"""Tests for localdynamo/faultproxy.py against a real moto server.

No Django involved: the proxy is plain test infrastructure.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError, ConnectionClosedError, ReadTimeoutError

from django_dynlock.engine.clock import parse_http_date
from localdynamo.faultproxy import FaultProxy
from localdynamo.partitions import Partitions, units_by_key
from localdynamo.servers import DUMMY_CREDENTIALS, DUMMY_REGION, LocalServer, start_moto_server

# total_max_attempts, not max_attempts: botocore's "max_attempts" counts
# *retries*, so max_attempts=1 would quietly retry every fault once.
CLIENT_CONFIG = Config(
    retries={"total_max_attempts": 1, "mode": "standard"},
    connect_timeout=1,
    read_timeout=1,
)
_session = boto3.session.Session(**DUMMY_CREDENTIALS, region_name=DUMMY_REGION)


def make_client(endpoint_url: str) -> Any:
    return _session.client("dynamodb", endpoint_url=endpoint_url, config=CLIENT_CONFIG)


@pytest.fixture(scope="module")
def moto() -> Iterator[LocalServer]:
    with start_moto_server(timeout=20.0) as server:
        yield server


@pytest.fixture
def direct(moto: LocalServer) -> Iterator[Any]:
    """A client talking to moto directly, bypassing the proxy."""
    client = make_client(moto.endpoint_url)
    yield client
    client.close()


@pytest.fixture
def table(direct: Any) -> str:
    name = f"fp-{uuid.uuid4().hex[:12]}"
    direct.create_table(
        TableName=name,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    return name


@pytest.fixture
def proxy(moto: LocalServer) -> Iterator[FaultProxy]:
    with FaultProxy(moto.endpoint_url, seed=1234, max_seconds=60) as p:
        yield p
    assert not p.errors


@pytest.fixture
def client(proxy: FaultProxy) -> Iterator[Any]:
    c = make_client(proxy.endpoint_url)
    yield c
    c.close()


def key(pk: str) -> dict[str, Any]:
    return {"pk": {"S": pk}}


def exists(direct: Any, table: str, pk: str) -> bool:
    return "Item" in direct.get_item(TableName=table, Key=key(pk), ConsistentRead=True)


def raw_request(conn: http.client.HTTPConnection, operation: str, body: dict) -> tuple[int, dict]:
    """One DynamoDB JSON call without botocore (moto does not check signatures)."""
    conn.request(
        "POST",
        "/",
        body=json.dumps(body),
        headers={
            "X-Amz-Target": f"DynamoDB_20120810.{operation}",
            "Content-Type": "application/x-amz-json-1.0",
            "Authorization": f"AWS4-HMAC-SHA256 Credential={DUMMY_CREDENTIALS['aws_access_key_id']}/20240101/{DUMMY_REGION}/dynamodb/aws4_request, SignedHeaders=host, Signature=00",
        },
    )
    resp = conn.getresponse()
    return resp.status, json.loads(resp.read() or b"{}")


# -- plain forwarding ----------------------------------------------------------


def test_forwards_requests_and_responses(proxy: FaultProxy, client: Any, direct: Any) -> None:
    name = f"fp-{uuid.uuid4().hex[:12]}"
    client.create_table(
        TableName=name,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    client.put_item(TableName=name, Item={**key("a"), "v": {"N": "7"}})
    assert client.get_item(TableName=name, Key=key("a"))["Item"] == {**key("a"), "v": {"N": "7"}}
    assert exists(direct, name, "a")

    # Upstream errors pass through untouched, status and all.
    with pytest.raises(ClientError) as info:
        client.get_item(TableName="no-such-table", Key=key("a"))
    assert info.value.response["Error"]["Code"] == "ResourceNotFoundException"
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400

    stats = proxy.stats
    assert stats.forwarded == stats.requests == proxy.requests_seen == 4
    assert stats.faults == {}
    assert stats.operations == {"CreateTable": 1, "PutItem": 1, "GetItem": 2}


def test_client_keep_alive_survives_injected_errors(proxy: FaultProxy, table: str) -> None:
    proxy.add_fault("http500", operation="DescribeTable")
    proxy.add_fault("throttle", operation="DescribeTable")
    conn = http.client.HTTPConnection("127.0.0.1", int(proxy.endpoint_url.rsplit(":", 1)[1]), timeout=2)
    try:
        sockets = []
        outcomes = []
        for _ in range(4):
            status, body = raw_request(conn, "DescribeTable", {"TableName": table})
            outcomes.append((status, body.get("__type", "").rpartition("#")[2]))
            sockets.append(conn.sock)
        assert outcomes == [
            (500, "InternalServerError"),
            (400, "ProvisionedThroughputExceededException"),
            (200, ""),
            (200, ""),
        ]
        # http.client silently reconnects after a close; same socket = kept alive.
        assert all(s is sockets[0] and s is not None for s in sockets)
    finally:
        conn.close()


# -- each fault kind, as botocore sees it --------------------------------------


@pytest.mark.parametrize(
    "kind, error, code, applied",
    [
        ("http500", ClientError, "InternalServerError", False),
        ("throttle", ClientError, "ProvisionedThroughputExceededException", False),
        ("delay", ReadTimeoutError, None, True),
        ("delay_reply", ReadTimeoutError, None, True),
        ("reset", ConnectionClosedError, None, False),
        ("drop_reply", ConnectionClosedError, None, True),
        ("http500_applied", ClientError, "InternalServerError", True),
    ],
)
def test_fault_surfaces_in_botocore(
    proxy: FaultProxy,
    client: Any,
    direct: Any,
    table: str,
    kind: str,
    error: type[Exception],
    code: str | None,
    applied: bool,
) -> None:
    handle = proxy.add_fault(kind, operation="PutItem", delay_seconds=1.5)
    with pytest.raises(error) as info:
        client.put_item(TableName=table, Item=key(kind))
    if code is None:
        assert type(info.value) is error  # exactly this class, observed with botocore 1.44
    else:
        response = info.value.response  # type: ignore[attr-defined]
        assert response["Error"]["Code"] == code
        assert response["Error"]["Message"] == "injected"
        assert response["ResponseMetadata"]["HTTPStatusCode"] == (500 if kind.startswith("http500") else 400)
        assert isinstance(info.value, getattr(client.exceptions, code))
    assert handle.fired == 1 and proxy.stats[kind] == 1

    # A delayed write lands only after the delay: wait for it (bounded).
    deadline = time.monotonic() + (3.0 if kind == "delay" else 0.0)
    seen = exists(direct, table, kind)
    while applied and not seen and time.monotonic() < deadline:
        time.sleep(0.1)
        seen = exists(direct, table, kind)
    assert seen is applied
    assert proxy.stats.forwarded == (1 if applied else 0)

    # The fault was one-shot; the same client works again.
    client.put_item(TableName=table, Item=key("after"))
    assert exists(direct, table, "after")


def _send_raw_put(proxy: FaultProxy, table: str) -> bytes | Exception:
    body = json.dumps({"TableName": table, "Item": key("raw")}).encode()
    head = (
        "POST / HTTP/1.1\r\nHost: x\r\nX-Amz-Target: DynamoDB_20120810.PutItem\r\n"
        "Content-Type: application/x-amz-json-1.0\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    port = int(proxy.endpoint_url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
        sock.sendall(head + body)
        try:
            return sock.recv(65536)
        except OSError as exc:
            return exc


def test_reset_sends_rst_and_drop_reply_a_plain_close(proxy: FaultProxy, table: str) -> None:
    proxy.add_fault("reset")
    assert isinstance(_send_raw_put(proxy, table), ConnectionResetError)
    proxy.add_fault("drop_reply")
    assert _send_raw_put(proxy, table) == b""


def _reply_date(client: Any, table: str) -> float | None:
    reply = client.get_item(TableName=table, Key=key("a"))
    return parse_http_date(reply["ResponseMetadata"]["HTTPHeaders"].get("date"))


def test_shift_date_and_strip_date_rewrite_the_reply_date(proxy: FaultProxy, client: Any, table: str) -> None:
    shifted = proxy.add_fault("shift_date", operation="GetItem", date_offset=-60.0)
    stripped = proxy.add_fault("strip_date", operation="GetItem")
    before = time.time()
    moved, missing, plain = (_reply_date(client, table) for _ in range(3))
    after = time.time()
    assert moved is not None and before - 61 <= moved <= after - 59, (before, moved)
    assert missing is None and shifted.fired == stripped.fired == 1
    assert plain is not None and before - 1 <= plain <= after
    assert proxy.stats.faults == {"shift_date": 1, "strip_date": 1}

    proxy.set_dates(offset=3600.0)
    ahead = _reply_date(client, table)
    assert ahead is not None and before + 3599 <= ahead <= time.time() + 3600
    proxy.set_dates(strip=True)
    assert _reply_date(client, table) is None
    proxy.set_dates()
    assert _reply_date(client, table) is not None


# -- scripted selection ----------------------------------------------------------


def test_scripted_fault_by_operation_match_and_times(proxy: FaultProxy, client: Any, direct: Any, table: str) -> None:
    handle = proxy.add_fault(
        "throttle",
        operation="PutItem",
        match=lambda body: body["Item"]["pk"]["S"] == "victim",
        times=2,
    )
    client.put_item(TableName=table, Item=key("bystander"))  # other item
    client.get_item(TableName=table, Key=key("victim"))  # other operation
    client.delete_item(TableName=table, Key=key("victim"))  # other operation
    assert handle.fired == 0

    for _ in range(2):
        with pytest.raises(ClientError) as info:
            client.put_item(TableName=table, Item=key("victim"))
        assert info.value.response["Error"]["Code"] == "ProvisionedThroughputExceededException"
    assert handle.fired == 2 and handle.remaining == 0
    assert not exists(direct, table, "victim")

    client.put_item(TableName=table, Item=key("victim"))  # times exhausted
    assert exists(direct, table, "victim")
    stats = proxy.stats
    assert stats.faults == {"throttle": 2}
    assert stats.faults_by_operation == {"PutItem": {"throttle": 2}}
    assert stats.operations == {"PutItem": 4, "GetItem": 1, "DeleteItem": 1}


def test_scripted_faults_take_precedence_over_rates(proxy: FaultProxy, client: Any, table: str) -> None:
    proxy.set_rates({"throttle": 1.0})
    proxy.add_fault("http500", operation="GetItem")
    with pytest.raises(ClientError) as info:
        client.get_item(TableName=table, Key=key("x"))
    assert info.value.response["Error"]["Code"] == "InternalServerError"
    with pytest.raises(ClientError) as info:
        client.get_item(TableName=table, Key=key("x"))
    assert info.value.response["Error"]["Code"] == "ProvisionedThroughputExceededException"
    proxy.clear_faults()
    client.get_item(TableName=table, Key=key("x"))


def test_match_errors_are_recorded_not_injected(moto: LocalServer, table: str) -> None:
    with FaultProxy(moto.endpoint_url) as proxy:
        c = make_client(proxy.endpoint_url)
        try:
            handle = proxy.add_fault("http500", match=lambda body: body["missing"])
            c.get_item(TableName=table, Key=key("x"))
        finally:
            c.close()
        assert handle.fired == 0
        assert [type(e) for e in proxy.errors] == [KeyError]


# -- random rates ----------------------------------------------------------------


def _outcomes(moto: LocalServer, table: str, seed: int, n: int) -> list[str]:
    with FaultProxy(moto.endpoint_url, seed=seed) as proxy:
        proxy.set_rates({"http500": 0.1, "throttle": 0.05}, operations={"GetItem"})
        c = make_client(proxy.endpoint_url)
        outcomes = []
        try:
            c.put_item(TableName=table, Item=key("r"))  # not in `operations`: never faulted
            for _ in range(n):
                try:
                    c.get_item(TableName=table, Key=key("r"))
                    outcomes.append("ok")
                except ClientError as exc:
                    outcomes.append(exc.response["Error"]["Code"])
        finally:
            c.close()
        stats = proxy.stats
        assert stats.faults_by_operation.get("PutItem") is None
        assert stats["http500"] == outcomes.count("InternalServerError")
        assert stats["throttle"] == outcomes.count("ProvisionedThroughputExceededException")
    return outcomes


def test_seeded_rates_are_roughly_right_and_deterministic(moto: LocalServer, table: str) -> None:
    n = 400
    first = _outcomes(moto, table, seed=7, n=n)
    assert 0.05 * n <= first.count("InternalServerError") <= 0.15 * n
    assert 0.02 * n <= first.count("ProvisionedThroughputExceededException") <= 0.08 * n
    assert _outcomes(moto, table, seed=7, n=n) == first


def test_concurrent_clients_with_random_faults(moto: LocalServer, table: str) -> None:
    threads, per_thread = 8, 25
    errors: list[Exception] = []
    oks: list[int] = []
    with FaultProxy(moto.endpoint_url, seed=3) as proxy:
        proxy.set_rates({"http500": 0.1, "reset": 0.1, "drop_reply": 0.1})
        clients = [make_client(proxy.endpoint_url) for _ in range(threads)]

        def work(c: Any, t: int) -> None:
            for i in range(per_thread):
                try:
                    c.put_item(TableName=table, Item=key(f"c{t}-{i}"))
                    oks.append(1)
                except (ClientError, ConnectionClosedError) as exc:
                    errors.append(exc)

        workers = [threading.Thread(target=work, args=(c, t)) for t, c in enumerate(clients)]
        try:
            for w in workers:
                w.start()
            for w in workers:
                w.join(15)
            assert not any(w.is_alive() for w in workers)
        finally:
            for c in clients:
                c.close()
        stats = proxy.stats
        assert not proxy.errors
    assert len(oks) + len(errors) == stats.requests == threads * per_thread
    assert sum(stats.faults.values()) == len(errors) > 0
    assert stats.forwarded == len(oks) + stats["drop_reply"]


# -- partitions: a token bucket per key --------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_partition_counts_reads_and_writes_apart_and_refills_at_its_rate() -> None:
    clock = FakeClock()
    parts = Partitions(read_units=4, write_units=2, clock=clock)
    read = {"Key": {"key": {"S": "a"}}, "ConsistentRead": True}
    write = {"Key": {"key": {"S": "a"}}}
    assert [parts.admit("GetItem", read) for _ in range(5)] == [True] * 4 + [False]
    assert [parts.admit("UpdateItem", write) for _ in range(3)] == [True, True, False]  # its own bucket
    assert parts.admit("GetItem", {"Key": {"key": {"S": "b"}}, "ConsistentRead": True})  # another key
    # Eventually consistent reads take half a unit; a throttled request takes nothing.
    clock.now += 0.25  # one read unit back
    assert [parts.admit("GetItem", {"Key": {"key": {"S": "a"}}}) for _ in range(3)] == [True, True, False]
    clock.now += 10  # refilled to the burst (1 s of rate), not beyond
    assert sum(parts.admit("GetItem", read) for _ in range(10)) == 4
    # Scans and table requests touch no key.
    assert all(parts.admit("Scan", {"TableName": "t"}) for _ in range(50))
    counts = parts.counts()
    assert vars(counts["a"]) == {"reads": 10, "writes": 2, "read_throttles": 8, "write_throttles": 1}
    assert counts["b"].reads == 1 and parts.total().throttles == 9


def test_transactions_take_twice_from_every_key_or_nothing() -> None:
    clock = FakeClock()
    parts = Partitions(read_units=10, write_units=3, clock=clock)
    both = {"TransactItems": [{"Update": {"Key": {"key": {"S": k}}}} for k in ("x", "y")]}
    assert units_by_key("TransactWriteItems", both) == {"x": 2.0, "y": 2.0}
    assert parts.admit("TransactWriteItems", both)
    assert not parts.admit("TransactWriteItems", both)  # 1 unit left in each
    assert parts.admit("PutItem", {"Item": {"key": {"S": "x"}, "owner": {"S": "o"}}})
    assert units_by_key("BatchGetItem", {"RequestItems": {"t": {"Keys": [{"key": {"S": "z"}}]}}}) == {"z": 0.5}


@pytest.mark.parametrize("code", ["ProvisionedThroughputExceededException", "ThrottlingException"])
def test_the_proxy_throttles_a_hot_key_like_dynamodb(proxy: FaultProxy, client: Any, table: str, code: str) -> None:
    clock = FakeClock()
    parts = Partitions(read_units=3, write_units=2, key_attribute="pk", error_code=code, clock=clock)
    proxy.limit_partitions(parts)
    outcomes = []
    for _ in range(5):
        try:
            client.get_item(TableName=table, Key=key("hot"), ConsistentRead=True)
            outcomes.append("ok")
        except ClientError as exc:
            outcomes.append(exc.response["Error"]["Code"])
            assert exc.response["ResponseMetadata"]["HTTPStatusCode"] == 400
            assert "throughput" in exc.response["Error"]["Message"].lower()
    assert outcomes == ["ok"] * 3 + [code] * 2
    client.put_item(TableName=table, Item={**key("hot"), "v": {"S": "1"}})  # writes have their own bucket
    client.get_item(TableName=table, Key=key("cold"), ConsistentRead=True)  # another partition
    clock.now += 0.5  # 1.5 read units back
    client.get_item(TableName=table, Key=key("hot"), ConsistentRead=True)
    assert proxy.stats["partition"] == 2 and proxy.stats.faults_by_operation == {"GetItem": {"partition": 2}}
    assert vars(parts.counts()["hot"]) == {"reads": 4, "writes": 1, "read_throttles": 2, "write_throttles": 0}
    proxy.limit_partitions(None)
    for _ in range(5):
        client.get_item(TableName=table, Key=key("hot"), ConsistentRead=True)
    assert proxy.stats["partition"] == 2


@pytest.mark.parametrize(
    "kwargs", [{"read_units": 0}, {"write_units": -1}, {"burst_seconds": 0}, {"error_code": "Throttled"}]
)
def test_partitions_refuse_bad_arguments(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        Partitions(**kwargs)


# -- pause / resume --------------------------------------------------------------


def test_pause_resets_requests_until_resume(proxy: FaultProxy, client: Any, direct: Any, table: str) -> None:
    client.put_item(TableName=table, Item=key("before"))
    proxy.pause()
    for i in range(3):
        with pytest.raises(ConnectionClosedError):
            client.put_item(TableName=table, Item=key(f"during{i}"))
    assert proxy.stats["paused"] == 3
    assert not exists(direct, table, "during0")
    proxy.resume()
    client.put_item(TableName=table, Item=key("after"))
    assert exists(direct, table, "after")
    assert proxy.stats.forwarded == 2


# -- budget and lifecycle --------------------------------------------------------


def test_stops_injecting_after_max_requests(moto: LocalServer, table: str) -> None:
    with FaultProxy(moto.endpoint_url, max_requests=3) as proxy:
        proxy.set_rates({"http500": 1.0})
        scripted = proxy.add_fault("throttle", operation="PutItem", times=100)
        c = make_client(proxy.endpoint_url)
        try:
            for _ in range(3):
                with pytest.raises(ClientError):
                    c.get_item(TableName=table, Key=key("x"))
            assert proxy.injecting is True
            c.get_item(TableName=table, Key=key("x"))
            assert proxy.injecting is False
            c.put_item(TableName=table, Item=key("x"))  # the scripted fault is ignored too
            proxy.pause()  # and so is pause
            c.get_item(TableName=table, Key=key("x"))
        finally:
            c.close()
        assert scripted.fired == 0
        assert proxy.stats.faults == {"http500": 3}
        assert proxy.requests_seen == 6


def test_stops_injecting_after_max_seconds(moto: LocalServer, table: str) -> None:
    with FaultProxy(moto.endpoint_url, max_seconds=0.3) as proxy:
        proxy.set_rates({"http500": 1.0})
        c = make_client(proxy.endpoint_url)
        try:
            with pytest.raises(ClientError):
                c.get_item(TableName=table, Key=key("x"))
            time.sleep(0.4)
            c.get_item(TableName=table, Key=key("x"))
        finally:
            c.close()
        assert proxy.stats.faults == {"http500": 1}


def _refused(url: str) -> bool:
    try:
        socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=1).close()
    except ConnectionRefusedError:
        return True
    except ConnectionResetError:
        # Our connection sat in the backlog of a listener that was closing: it is going
        # away, but not refusing yet. Look again.
        return False
    return False


def test_stop_is_prompt_idempotent_and_frees_the_port(moto: LocalServer, table: str) -> None:
    proxy = FaultProxy(moto.endpoint_url).start()
    port = int(proxy.endpoint_url.rsplit(":", 1)[1])
    idle = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    results: list[object] = []
    waiter: threading.Thread | None = None
    try:
        assert raw_request(idle, "DescribeTable", {"TableName": table})[0] == 200  # now idle, kept alive
        proxy.add_fault("delay", delay_seconds=30)
        stuck = http.client.HTTPConnection("127.0.0.1", port, timeout=5)

        def call(conn: http.client.HTTPConnection = stuck) -> None:
            try:
                results.append(raw_request(conn, "DescribeTable", {"TableName": table}))
            except (OSError, http.client.HTTPException) as exc:
                results.append(exc)
            finally:
                conn.close()

        waiter = threading.Thread(target=call, daemon=True)
        waiter.start()
        deadline = time.monotonic() + 2
        while proxy.stats["delay"] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)

        started = time.monotonic()
        proxy.stop()
        assert time.monotonic() - started < 1.5
        proxy.stop()  # idempotent
        waiter.join(3)
        assert not waiter.is_alive()
        assert isinstance(results[0], (ConnectionResetError, http.client.RemoteDisconnected))
        assert _refused(proxy.endpoint_url)
        assert proxy.stats.forwarded == 1  # the delayed request was never forwarded
    finally:
        idle.close()
        proxy.stop()
        if waiter is not None:
            waiter.join(3)


def test_proxy_shuts_itself_down_after_lifetime(moto: LocalServer) -> None:
    proxy = FaultProxy(moto.endpoint_url, lifetime_seconds=0.2).start()
    try:
        deadline = time.monotonic() + 3
        while not _refused(proxy.endpoint_url) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _refused(proxy.endpoint_url)
    finally:
        proxy.stop()


@pytest.mark.parametrize(
    "call",
    [
        lambda p: p.add_fault("explode"),
        lambda p: p.add_fault("delay"),
        lambda p: p.add_fault("reset", times=0),
        lambda p: p.set_rates({"http500": 0.7, "reset": 0.4}),
        lambda p: p.set_rates({"throttle": -0.1}),
    ],
)
def test_rejects_bad_arguments(moto: LocalServer, call: Callable[[FaultProxy], object]) -> None:
    proxy = FaultProxy(moto.endpoint_url)
    try:
        with pytest.raises(ValueError):
            call(proxy)
    finally:
        proxy.stop()  # never started: must still release the socket


def test_a_proxy_502_counts_as_possibly_applied_and_retryable() -> None:
    # A proxy in front of DynamoDB answers 502/504 when its upstream fails, possibly after
    # passing the request on: the engine must treat it like DynamoDB's own 5xx.
    from django_dynlock.engine.failures import may_have_applied, translate

    with socket.socket() as spare:
        spare.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{spare.getsockname()[1]}"  # bound, not listening: refused
    with FaultProxy(dead, max_seconds=30) as proxy:
        with pytest.raises(ClientError) as info:
            make_client(proxy.endpoint_url).describe_table(TableName="any")
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 502
    assert may_have_applied(info.value)
    assert translate(info.value, table="any", endpoint=proxy.endpoint_url, action="test").retryable
