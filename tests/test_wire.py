"""The wire path (engine/wire.py, issue 40): the engine's requests are still AWS's.

- Every request kind the engine sends, captured from a real run of its flows, is sent by
  the wire path with the method, URL, headers, body and signature botocore produces for
  the same parameters, credentials and frozen time.
- Error replies from real servers (DynamoDB Local, dynalite, moto) and faults through the
  fault proxy reach the engine as the same ClientError (class, code, message, status,
  item, cancellation reasons) or transport exception as through boto3, and translate alike.
- Refreshable credentials are refreshed per request as botocore refreshes them.
- A reply's Date header still reaches the client's view of DynamoDB's clock.
"""

from __future__ import annotations

import copy
import datetime
import itertools
import json
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import pytest
from botocore.awsrequest import AWSResponse
from botocore.credentials import RefreshableCredentials
from botocore.exceptions import BotoCoreError, ClientError

from django_dynlock.engine import ClientOptions, LockClient
from django_dynlock.engine.connection import build_boto_client
from django_dynlock.engine.failures import may_have_applied, translate
from django_dynlock.engine.options import merge_client_config
from django_dynlock.engine.wire import OPERATIONS, Wire
from django_dynlock.exceptions import LockNotAcquired
from localdynamo.faultproxy import FaultProxy
from localdynamo.servers import dummy_client, suite_region, suite_session_options
from tests.support.wire import wire_under_test

FROZEN = datetime.datetime(2026, 11, 28, 1, 2, 3, tzinfo=datetime.UTC)
SNAKE = {op: name for name, op in OPERATIONS.items()}
on_the_wire_path = pytest.mark.skipif(wire_under_test() != "dynlock", reason="DYNLOCK_TEST_WIRE=boto3: no wire path")


def boto_for(endpoint_url: str, table: str = "django_dynlock", **options: Any) -> Any:
    """A boto3 client built as the engine builds its own."""
    return build_boto_client(
        ClientOptions(
            endpoint_url=endpoint_url,
            table_name=table,
            region_name=suite_region(),
            session_options=suite_session_options(),
            client_config=merge_client_config(None),
            **options,
        )
    )


# -- the requests ---------------------------------------------------------------------------


def engine_requests(client: LockClient, other: LockClient) -> list[tuple[str, dict[str, Any]]]:
    """The parameters of every request ``client`` sends in its flows, by operation."""
    seen: list[tuple[str, dict[str, Any]]] = []

    def capture(model: Any, params: dict[str, Any], **_: Any) -> None:
        params = copy.deepcopy(params)
        params.pop("ClientRequestToken", None)  # botocore's own handler fills it in
        seen.append((model.name, params))

    client.boto.meta.events.register("before-parameter-build.dynamodb", capture, unique_id="test-wire-capture")
    lease = client.acquire("a")
    lease.extend()
    client.get("a")
    handover = lease.hand_over()
    client.adopt(handover).release()
    other.acquire("busy")
    with pytest.raises(LockNotAcquired):
        client.acquire("busy", wait=0)  # a failed condition; dynalite: a GetItem after it
    for lease in client.acquire_many(["m1", "m2"]):
        lease.release()
    with pytest.raises(LockNotAcquired):
        client.acquire_many(["m3", "busy"], wait=0)
    list(client.leases())
    client.break_lease("busy", reason="test")
    other.acquire("released").release()
    client.boto.meta.events.unregister("before-parameter-build.dynamodb", unique_id="test-wire-capture")
    return seen


class Stub:
    """Answers every request at ``before-send`` (no network) and keeps what was sent."""

    def __init__(self, boto: Any) -> None:
        self.sent: list[Any] = []
        self.signed = 0  # botocore's own signer's requests
        boto.meta.events.register("before-send.dynamodb", self.answer)
        boto.meta.events.register("before-sign.dynamodb", self.count)

    def count(self, **_: Any) -> None:
        self.signed += 1

    def answer(self, request: Any, **_: Any) -> AWSResponse:
        self.sent.append(request)
        response = AWSResponse(request.url, 200, {"Date": "Sat, 28 Nov 2026 01:02:03 GMT"}, None)
        response._content = b"{}"
        return response


def seen_as_sent(request: Any) -> dict[str, Any]:
    headers = {k: v.decode() if isinstance(v, bytes) else v for k, v in request.headers.items()}
    return {"method": request.method, "url": request.url, "headers": headers, "body": request.body}


@pytest.fixture
def frozen() -> Iterator[Callable[[], None]]:
    """botocore's clock for signing frozen (as botocore's own tests freeze it), and uuid4
    (invocation ids, a transaction's token) a fixed sequence restarted by the function returned."""
    counter = itertools.count()

    def restart() -> None:
        nonlocal counter
        counter = itertools.count()

    with (
        mock.patch("botocore.auth.get_current_datetime", return_value=FROZEN),
        mock.patch("uuid.uuid4", side_effect=lambda: uuid.UUID(int=next(counter))),
    ):
        yield restart


@on_the_wire_path
def test_every_request_the_engine_sends_is_botocores_to_the_byte(server, frozen):
    # The engine's own requests, on each server (dynalite's flows add GetItems, DynamoDB
    # Local's transactions and their reads).
    from tests.support.clients import client_for

    table = f"wire-{uuid.uuid4().hex[:8]}"
    client = client_for(server.endpoint_url, table)
    other = client_for(server.endpoint_url, table)
    try:
        client.create_table(wait=True)
        requests = engine_requests(client, other)
    finally:
        client.close(release=True)
        other.close(release=True)
    kinds = {name for name, _ in requests}
    assert {"UpdateItem", "GetItem", "Scan"} <= kinds, kinds
    if server.kind == "dynamodb-local":
        assert {"TransactWriteItems", "BatchGetItem"} <= kinds, kinds

    reference, ours = boto_for("http://127.0.0.1:9", table), boto_for("http://127.0.0.1:9", table)
    sent_by_botocore, sent_by_wire = Stub(reference), Stub(ours)
    wire = Wire(ours)
    compared = set()
    for name, params in requests:
        method = SNAKE[name]
        getattr(reference, method)(**copy.deepcopy(params))  # as warm as the wire's
        wire.call(method, copy.deepcopy(params))  # the first of a kind: boto3's, learnt from
        frozen()
        getattr(reference, method)(**copy.deepcopy(params))
        frozen()
        signed = sent_by_wire.signed
        wire.call(method, copy.deepcopy(params))
        assert sent_by_wire.signed == signed, f"{name} went through botocore's signer, not the wire path"
        expected, got = seen_as_sent(sent_by_botocore.sent[-1]), seen_as_sent(sent_by_wire.sent[-1])
        assert got == expected, name
        assert "Signature=" in got["headers"]["Authorization"]
        compared.add(name)
    assert compared == kinds


# -- the replies ------------------------------------------------------------------------------


def outcome(call: Callable[[], Any]) -> dict[str, Any]:
    """What the engine learns from a call: the reply's content, or the exception as it is classified."""
    try:
        reply = call()
    except ClientError as exc:
        error = translate(exc, table="t", endpoint="http://127.0.0.1:1", action="test", key_attribute="key")
        response = dict(exc.response)
        metadata = response.pop("ResponseMetadata")
        return {
            "class": type(exc).__name__,
            "operation": exc.operation_name,
            "response": response,  # Error (Code, Message), Item, CancellationReasons, message
            "status": metadata["HTTPStatusCode"],
            "has_date": "date" in metadata["HTTPHeaders"],
            "translated": (type(error).__name__, str(error), getattr(error, "retryable", None)),
            "ambiguous": may_have_applied(exc),
        }
    except BotoCoreError as exc:
        error = translate(exc, table="t", endpoint="http://127.0.0.1:1", action="test")
        return {
            "class": type(exc).__name__,
            "translated": (type(error).__name__, str(error), getattr(error, "retryable", None)),
            "ambiguous": may_have_applied(exc),
        }
    reply = dict(reply)
    metadata = reply.pop("ResponseMetadata")
    return {"reply": reply, "status": metadata["HTTPStatusCode"], "has_date": "date" in metadata["HTTPHeaders"]}


def each_way(endpoint_url: str, table: str) -> tuple[Any, Wire]:
    """A boto3 client, and the wire path on another, having learnt every operation used below."""
    boto, wire = boto_for(endpoint_url, table), Wire(boto_for(endpoint_url, table))
    key = {"key": {"S": "learn"}}
    wire.call(
        "update_item",
        {
            "TableName": table,
            "Key": key,
            "UpdateExpression": "SET #o = :o",
            "ExpressionAttributeNames": {"#o": "owner"},
            "ExpressionAttributeValues": {":o": {"S": "x"}},
        },
    )
    wire.call("get_item", {"TableName": table, "Key": key})
    wire.call("batch_get_item", {"RequestItems": {table: {"Keys": [key]}}})
    wire.call("scan", {"TableName": table, "Limit": 1})
    try:
        wire.call(
            "transact_write_items",
            {
                "TransactItems": [
                    {
                        "ConditionCheck": {
                            "TableName": table,
                            "Key": key,
                            "ConditionExpression": "attribute_exists(#o)",
                            "ExpressionAttributeNames": {"#o": "owner"},
                        }
                    }
                ]
            },
        )
    except ClientError:
        pass  # dynalite has no transactions: its error is compared below all the same
    return boto, wire


def update(table: str, key: str, condition: str) -> dict[str, Any]:
    return {
        "TableName": table,
        "Key": {"key": {"S": key}},
        "UpdateExpression": "SET #o = :me, #n = :n",
        "ConditionExpression": condition,
        "ExpressionAttributeNames": {"#o": "owner", "#n": "n"},
        "ExpressionAttributeValues": {":me": {"S": "me"}, ":n": {"N": "1.50"}},
        "ReturnValues": "ALL_NEW",
        "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
    }


CASES: dict[str, Callable[[str], tuple[str, dict[str, Any]]]] = {
    "update applied": lambda t: ("update_item", update(t, "free", "attribute_not_exists(#o) OR #o = :me")),
    "failed condition, with the item": lambda t: ("update_item", update(t, "held", "#o = :me")),
    "consistent read": lambda t: ("get_item", {"TableName": t, "Key": {"key": {"S": "held"}}, "ConsistentRead": True}),
    "missing table": lambda t: ("update_item", update(t + "-missing", "k", "attribute_not_exists(#o)")),
    "not the table's key": lambda t: ("get_item", {"TableName": t, "Key": {"pk": {"S": "x"}}}),
    "batch read, missing table": lambda t: (
        "batch_get_item",
        {"RequestItems": {t + "-missing": {"Keys": [{"key": {"S": "a"}}]}}},
    ),
    "cancelled transaction": lambda t: (
        "transact_write_items",
        {
            "TransactItems": [
                {
                    "Update": {
                        k: v
                        for k, v in update(t, "held", "#o = :me").items()
                        if k not in ("ReturnValues", "ReturnValuesOnConditionCheckFailure")
                    }
                    | {"ReturnValuesOnConditionCheckFailure": "ALL_OLD"}
                },
                {
                    "ConditionCheck": {
                        "TableName": t,
                        "Key": {"key": {"S": "free2"}},
                        "ConditionExpression": "attribute_exists(#o)",
                        "ExpressionAttributeNames": {"#o": "owner"},
                    }
                },
            ]
        },
    ),
    "scan": lambda t: ("scan", {"TableName": t, "ConsistentRead": True}),
}


@pytest.fixture(params=["dynamodb-local", "dynalite", "moto"])
def any_server(request) -> Any:
    return request.getfixturevalue(f"{request.param.replace('-', '_')}_server")


@on_the_wire_path
def test_replies_and_errors_of_real_servers_reach_the_engine_as_through_boto3(any_server):
    table = f"wire-{uuid.uuid4().hex[:8]}"
    admin = dummy_client(any_server.endpoint_url)
    admin.create_table(
        TableName=table,
        KeySchema=[{"AttributeName": "key", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "key", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    boto, wire = each_way(any_server.endpoint_url, table)
    for case, make in CASES.items():
        # The same state before each of the two: a held item, a free key.
        admin.put_item(TableName=table, Item={"key": {"S": "held"}, "owner": {"S": "other"}, "n": {"N": "7"}})
        admin.delete_item(TableName=table, Key={"key": {"S": "free"}})
        method, params = make(table)
        through_boto3 = outcome(lambda: getattr(boto, method)(**copy.deepcopy(params)))  # noqa: B023
        admin.put_item(TableName=table, Item={"key": {"S": "held"}, "owner": {"S": "other"}, "n": {"N": "7"}})
        admin.delete_item(TableName=table, Key={"key": {"S": "free"}})
        through_wire = outcome(lambda: wire.call(method, copy.deepcopy(params)))  # noqa: B023
        assert through_wire == through_boto3, case
        assert through_wire.get("has_date", True), case
    assert all(wire._templates[name] is not None for name in ("update_item", "get_item", "batch_get_item", "scan"))


@on_the_wire_path
@pytest.mark.parametrize("kind", ["throttle", "http500", "http500_applied", "reset", "drop_reply", "delay_reply"])
def test_faults_reach_the_engine_as_through_boto3(moto_server, kind):
    # Throttling, a server error, a reset connection, a lost or late reply: the same
    # exception, the same classification, the same "may have applied".
    table = f"wire-{uuid.uuid4().hex[:8]}"
    admin = dummy_client(moto_server.endpoint_url)
    admin.create_table(
        TableName=table,
        KeySchema=[{"AttributeName": "key", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "key", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    with FaultProxy(moto_server.endpoint_url, seed=40, max_seconds=60) as proxy:
        options = {"client_config": merge_client_config({"read_timeout": 0.5, "connect_timeout": 0.5})}
        boto = build_boto_client(
            ClientOptions(
                endpoint_url=proxy.endpoint_url,
                table_name=table,
                region_name=suite_region(),
                session_options=suite_session_options(),
                **options,
            )
        )
        wire = Wire(
            build_boto_client(
                ClientOptions(
                    endpoint_url=proxy.endpoint_url,
                    table_name=table,
                    region_name=suite_region(),
                    session_options=suite_session_options(),
                    **options,
                )
            )
        )
        params = update(table, "free", "attribute_not_exists(#o)")
        wire.call("update_item", copy.deepcopy(params))  # learnt
        results = []
        for send in (lambda p: boto.update_item(**p), lambda p: wire.call("update_item", p)):
            admin.delete_item(TableName=table, Key={"key": {"S": "free"}})
            handle = proxy.add_fault(kind, operation="UpdateItem", delay_seconds=1.0)
            results.append(outcome(lambda: send(copy.deepcopy(params))))  # noqa: B023
            assert handle.fired == 1
        assert results[1] == results[0]
        assert "reply" not in results[0]
    assert not proxy.errors


# -- credentials and the clock ------------------------------------------------------------------


@on_the_wire_path
def test_refreshable_credentials_are_refreshed_as_botocore_refreshes_them():
    refreshes = []

    def metadata(n: int, expires_in: float) -> dict[str, str]:
        expiry = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=expires_in)
        return {
            "access_key": f"AKIAROLE{n}",
            "secret_key": f"secret{n}",
            "token": f"token{n}",
            "expiry_time": expiry.isoformat(),
        }

    def refresh() -> dict[str, str]:
        refreshes.append(time.time())
        return metadata(len(refreshes), 3600)

    boto = boto_for("http://127.0.0.1:9")
    stub = Stub(boto)
    # Within botocore's mandatory refresh window (10 minutes): the next request refreshes first.
    boto._request_signer._credentials = RefreshableCredentials.create_from_metadata(
        metadata(0, 300), refresh_using=refresh, method="assume-role"
    )
    wire = Wire(boto)
    get = {"TableName": "t", "Key": {"key": {"S": "a"}}}
    wire.call("get_item", get)  # through boto3, learnt from: it refreshes
    assert len(refreshes) == 1
    assert "Credential=AKIAROLE1/" in stub.sent[-1].headers["Authorization"].decode()
    boto._request_signer._credentials._expiry_time = datetime.datetime.now(datetime.UTC) + datetime.timedelta(
        seconds=60
    )  # the role's keys near their end again
    wire.call("get_item", get)  # on the wire path
    assert len(refreshes) == 2
    headers = stub.sent[-1].headers
    assert "Credential=AKIAROLE2/" in headers["Authorization"]
    assert headers["X-Amz-Security-Token"] == "token2"
    assert "x-amz-security-token" in headers["Authorization"]  # signed, as botocore signs a session token
    wire.call("get_item", get)
    assert len(refreshes) == 2  # fresh for an hour: not refreshed again


@on_the_wire_path
def test_the_reply_date_still_bounds_dynamodbs_clock(dynlock):
    client = LockClient(dynlock.options)  # fresh: it knows nothing of DynamoDB's clock yet
    try:
        assert client._store.clock.bounds() is None
        client.acquire("a").release()  # the first UpdateItem through boto3, the second on the wire path
        wire = client._store.wire
        assert wire is not None and wire._templates["update_item"] is not None
        clock = client._store.clock
        with mock.patch.object(clock, "observe", wraps=clock.observe) as observe:
            client.acquire("b").release()  # both on the wire path
        dates = [call.args[2] for call in observe.call_args_list]
        assert len(dates) == 2 and all(abs(date - time.time()) < 5 for date in dates), dates
        assert client.server_time() == pytest.approx(time.time(), abs=5)
    finally:
        client.close(release=True)


def test_wire_boto3_sends_through_the_boto3_client(server):
    from tests.support.clients import client_for

    table = f"wire-{uuid.uuid4().hex[:8]}"
    client = client_for(server.endpoint_url, table, wire="boto3")
    try:
        client.create_table(wait=True)
        signed = []
        client.boto.meta.events.register("before-sign.dynamodb", lambda **_: signed.append(1))
        client.acquire("a").release()
        assert client._store.wire is None and len(signed) == 2
    finally:
        client.close(release=True)


def test_the_wire_setting_is_validated():
    from django_dynlock.exceptions import InvalidArgument

    with pytest.raises(InvalidArgument, match="wire must be one of 'dynlock', 'boto3', got 'botocore'"):
        ClientOptions(wire="botocore")
    json.dumps(ClientOptions(wire="boto3").wire)


def test_the_runs_wire_is_the_environments():
    # DYNLOCK_TEST_WIRE=boto3 (make test-latest's last step) must reach every client left at the default.
    assert ClientOptions().wire == wire_under_test()
    assert ClientOptions(wire="boto3").wire == "boto3"


@on_the_wire_path
@pytest.mark.parametrize(
    "status, body",
    [(200, b"<html>a proxy's page</html>"), (502, b"<html>Bad Gateway</html>"), (200, b""), (504, b"")],
)
def test_a_reply_that_is_not_json_is_parsed_as_botocore_parses_it(status, body):
    # An intermediary's answer (a proxy's page, an empty body): botocore's parser decides
    # what it means on both paths, and failures.py classifies it alike.
    def answer(request: Any, **_: Any) -> AWSResponse:
        response = AWSResponse(request.url, status, {"Date": "Sat, 28 Nov 2026 01:02:03 GMT"}, None)
        response._content = body
        return response

    reference, ours = boto_for("http://127.0.0.1:9"), boto_for("http://127.0.0.1:9")
    get = {"TableName": "t", "Key": {"key": {"S": "a"}}, "ConsistentRead": True}
    Stub(ours)
    wire = Wire(ours)
    wire.call("get_item", dict(get))  # learnt, answered by the stub registered first
    ours.meta.events.register_first("before-send.dynamodb", answer)
    reference.meta.events.register("before-send.dynamodb", answer)
    assert outcome(lambda: wire.call("get_item", dict(get))) == outcome(lambda: reference.get_item(**get))


# -- the client's resolved configuration ------------------------------------------------------


@on_the_wire_path
def test_the_endpoint_from_aws_endpoint_url_dynamodb_is_botocores(server, monkeypatch):
    # No ENDPOINT_URL: botocore resolves it from the environment, and the wire path sends there.
    from tests.support.clients import client_for

    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", server.endpoint_url)
    client = client_for(None, f"wire-{uuid.uuid4().hex[:8]}")
    try:
        client.create_table(wait=True)
        client.acquire("a").release()
        client.acquire("b").release()  # on the wire path
        template = client._store.wire._templates["update_item"]
        assert template is not None and template.url.rstrip("/") == server.endpoint_url.rstrip("/")
        assert client.get("b", include_released=True) is not None
    finally:
        client.close(release=True)


class ForwardProxy:
    """An HTTP forward proxy on loopback that counts the requests it passes on."""

    def __init__(self) -> None:
        import http.client
        import http.server
        import threading
        from urllib.parse import urlsplit

        proxy = self
        self.seen: list[str] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                target = urlsplit(self.path)  # absolute: a request to a forward proxy
                proxy.seen.append(self.headers.get("X-Amz-Target", ""))
                body = self.rfile.read(int(self.headers["Content-Length"]))
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("proxy-connection", "connection")}
                upstream = http.client.HTTPConnection(target.hostname, target.port, timeout=5)
                upstream.request("POST", target.path or "/", body, headers)
                reply = upstream.getresponse()
                data = reply.read()
                self.send_response(reply.status)
                for k, v in reply.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length", "date", "server"):
                        self.send_header(k, v)
                self.send_header("Date", reply.getheader("Date") or "")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                upstream.close()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@on_the_wire_path
def test_requests_go_through_the_proxy_of_the_client_config(server):
    # CLIENT_CONFIG's proxies are botocore's: the wire path's requests pass through them too.
    from tests.support.clients import client_for

    proxy = ForwardProxy()
    table = f"wire-{uuid.uuid4().hex[:8]}"
    client = client_for(server.endpoint_url, table, client_config={"proxies": {"http": proxy.url}})
    try:
        client.create_table(wait=True)
        proxy.seen.clear()
        for key in ("a", "b", "c"):
            client.acquire(key).release()
        assert client._store.wire._templates["update_item"] is not None
        assert proxy.seen == ["DynamoDB_20120810.UpdateItem"] * 6
    finally:
        client.close(release=True)
        proxy.close()
