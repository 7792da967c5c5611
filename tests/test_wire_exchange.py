"""The wire path's HTTP exchange on urllib3's pooled connections (engine/exchange.py).

Against a scripted HTTP server on loopback, which records the bytes of each request and
answers as told (a plain reply, or one only http.client should read, a reply late or
never), the wire path:

- writes the bytes urllib3 writes for the same request, in one write;
- reads every reply as botocore reads it through urllib3, the unusual ones through
  http.client itself;
- keeps a connection between requests, and makes a new one (through urllib3) when the
  server closed the pooled one;
- raises, for a late reply, a reset or a reply cut short, what boto3 raises.

Over TLS (a certificate made for the test, trusted through AWS_CA_BUNDLE) the exchange is
the same on the pooled TLS connection, and a certificate not trusted fails as through
boto3. A proxy is tests/test_wire.py's (the forward proxy of CLIENT_CONFIG, through
urlopen); an HTTPS proxy's CONNECT tunnel (a TLS proxy on loopback) is not tested.
"""

from __future__ import annotations

import copy
import datetime
import ipaddress
import itertools
import socket
import ssl
import struct
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import pytest
from botocore.exceptions import ConnectionClosedError

from django_dynlock.engine import ClientOptions
from django_dynlock.engine.connection import build_boto_client
from django_dynlock.engine.exchange import Connections
from django_dynlock.engine.options import merge_client_config
from django_dynlock.engine.wire import Wire
from localdynamo.servers import suite_region, suite_session_options
from tests.support.wire import wire_under_test
from tests.test_wire import outcome

pytestmark = pytest.mark.skipif(wire_under_test() != "dynlock", reason="DYNLOCK_TEST_WIRE=boto3: no wire path")

FROZEN = datetime.datetime(2026, 11, 28, 1, 2, 3, tzinfo=datetime.UTC)
ITEM = b'{"Item": {"key": {"S": "a"}, "owner": {"S": "me"}}}'
GET = {"TableName": "t", "Key": {"key": {"S": "a"}}, "ConsistentRead": True}


def plain(body: bytes = ITEM, extra: bytes = b"") -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\nDate: Sat, 28 Nov 2026 01:02:03 GMT\r\n"
        b"Content-Type: application/x-amz-json-1.0\r\nx-amzn-RequestId: r1\r\n"
        + extra
        + b"Content-Length: %d\r\n\r\n" % len(body)
        + body
    )


class Scripted:
    """An HTTP/1.1 server on loopback: each request's bytes are kept, and ``answer(n, request)``
    says what to do with the n-th (0-based): bytes to send, then the connection kept
    open or closed ("close"), reset ("reset") or left silent ("silent")."""

    def __init__(self, answer: Callable[[int, bytes], tuple[bytes, str]], tls: ssl.SSLContext | None = None) -> None:
        self.answer = answer
        self.tls = tls
        self.requests: list[bytes] = []
        self.connections = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.sock.getsockname()[1]}"
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self) -> None:
        self.sock.settimeout(0.2)
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(10)
        if self.tls is not None:
            try:
                conn = self.tls.wrap_socket(conn, server_side=True)
            except (OSError, ssl.SSLError):
                conn.close()  # the client refused our certificate
                return
        data = b""
        with conn:
            for _ in range(100):  # requests on one connection, bounded
                while b"\r\n\r\n" not in data:
                    try:
                        more = conn.recv(65536)
                    except OSError:
                        return
                    if not more:
                        return
                    data += more
                head, _, rest = data.partition(b"\r\n\r\n")
                length = next(
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                while len(rest) < length:
                    more = conn.recv(65536)
                    if not more:
                        return
                    rest += more
                request, data = head + b"\r\n\r\n" + rest[:length], rest[length:]
                index = len(self.requests)
                self.requests.append(request)
                reply, then = self.answer(index, request)
                if then == "silent":
                    self._stop.wait(5)
                    return
                if then == "reset":
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    return
                conn.sendall(reply)
                if then == "close":
                    return

    def close(self) -> None:
        self._stop.set()
        self.sock.close()
        for thread in self._threads:
            thread.join(6)


@pytest.fixture
def scripted() -> Iterator[Callable[..., Scripted]]:
    servers: list[Scripted] = []

    def start(answer: Callable[[int, bytes], tuple[bytes, str]], tls: ssl.SSLContext | None = None) -> Scripted:
        servers.append(Scripted(answer, tls))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def boto_at(url: str, **config: Any) -> Any:
    return build_boto_client(
        ClientOptions(
            endpoint_url=url,
            table_name="locks",
            region_name=suite_region(),
            session_options=suite_session_options(),
            client_config=merge_client_config(config or None),
        )
    )


@pytest.fixture
def frozen() -> Iterator[Callable[[], None]]:
    counter = itertools.count()

    def restart() -> None:
        nonlocal counter
        counter = itertools.count()

    with (
        mock.patch("botocore.auth.get_current_datetime", return_value=FROZEN),
        mock.patch("uuid.uuid4", side_effect=lambda: uuid.UUID(int=next(counter))),
    ):
        yield restart


class Exchanges:
    """How each request the wire path sent went: on a pooled connection (and whether
    http.client read its reply), or through urlopen."""

    def __init__(self) -> None:
        self.kinds: list[str] = []
        self.unusual = 0

    def __enter__(self) -> Exchanges:
        exchange, unusual = Connections.exchange, Connections._unusual
        record = self
        # Only this thread's requests: the patch is the class's, and a thread an earlier test
        # left in this worker (a heartbeat, a late retry) may send meanwhile (CI run 30 counted
        # one such 'urlopen' before the test's own 'lean').
        ours = threading.get_ident()

        def counted(connections: Connections, *args: Any) -> Any:
            if threading.get_ident() != ours:
                return exchange(connections, *args)
            try:
                reply = exchange(connections, *args)
            except BaseException:
                record.kinds.append("lean")
                raise
            record.kinds.append("urlopen" if reply is None else "lean")
            return reply

        def counted_unusual(*args: Any) -> Any:
            if threading.get_ident() == ours:
                record.unusual += 1
            return unusual(*args)

        self._patches = [
            mock.patch.object(Connections, "exchange", counted),
            mock.patch.object(Connections, "_unusual", staticmethod(counted_unusual)),
        ]
        for patch in self._patches:
            patch.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        for patch in self._patches:
            patch.stop()


def test_the_request_is_urllib3s_to_the_byte_in_one_write(scripted, frozen):
    # What urllib3 writes for the request botocore made (``URLLib3Session.send``), and
    # what the wire path writes on the pooled connection, for each kind of request.
    server = scripted(lambda n, request: (plain(b"{}"), "keep"))
    boto = boto_at(server.url)
    wire = Wire(boto)
    prepared: list[Any] = []
    boto.meta.events.register("before-send.dynamodb", lambda request, **_: prepared.append(request))
    update = {
        "TableName": "t",
        "Key": {"key": {"S": "a"}},
        "UpdateExpression": "SET #o = :me",
        "ConditionExpression": "attribute_not_exists(#o) OR #o = :me",
        "ExpressionAttributeNames": {"#o": "owner"},
        "ExpressionAttributeValues": {":me": {"S": "me é"}},
        "ReturnValues": "ALL_NEW",
    }
    sends = []
    with Exchanges() as exchanges:
        for method, params in (("get_item", GET), ("update_item", update), ("scan", {"TableName": "t"})):
            wire.call(method, copy.deepcopy(params))  # learnt: through boto3
            frozen()
            wire.call(method, copy.deepcopy(params))  # on the pooled connection
            ours = server.requests[-1]
            assert boto._endpoint.http_session.send(prepared[-1]).content == b"{}"  # the same through urllib3
            assert server.requests[-1] == ours, method
            sends.append(ours)
        assert exchanges.kinds == ["lean"] * 3
    assert server.connections == 1
    assert b"Host: 127.0.0.1:" in sends[0] and b"Accept-Encoding: identity\r\n" in sends[0]
    writes = []
    sendall = socket.socket.sendall

    def counted(sock: socket.socket, data: bytes, *args: Any) -> None:
        if sock.getpeername()[1] == server.sock.getsockname()[1]:  # the client's, not the server's reply
            writes.append(len(data))
        sendall(sock, data, *args)

    with mock.patch.object(socket.socket, "sendall", counted):
        wire.call("get_item", dict(GET))
    assert len(writes) == 1 and writes[0] == len(server.requests[-1])


def test_botocores_experimental_host_header_sends_through_urlopen(scripted, frozen, monkeypatch):
    # BOTO_EXPERIMENTAL__ADD_PROXY_HOST_HEADER: botocore puts a host header in the pool's
    # proxy_headers, which urlopen writes into every request, proxy or not.
    monkeypatch.setenv("BOTO_EXPERIMENTAL__ADD_PROXY_HOST_HEADER", "true")
    server = scripted(lambda n, request: (plain(b"{}"), "keep"))
    boto = boto_at(server.url)
    wire = Wire(boto)
    prepared: list[Any] = []
    boto.meta.events.register("before-send.dynamodb", lambda request, **_: prepared.append(request))
    wire.call("get_item", dict(GET))
    frozen()
    with Exchanges() as exchanges:
        wire.call("get_item", dict(GET))
    assert exchanges.kinds == ["urlopen"]
    ours = server.requests[-1]
    assert boto._endpoint.http_session.send(prepared[-1]).content == b"{}"
    assert server.requests[-1] == ours
    assert b"\r\nhost: 127.0.0.1\r\n" in ours


UNUSUAL = {
    "chunked": b"HTTP/1.1 200 OK\r\nDate: Sat, 28 Nov 2026 01:02:03 GMT\r\nx-amzn-RequestId: r1\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n10\r\n"
    + ITEM[:16]
    + b"\r\n%x\r\n" % (len(ITEM) - 16)
    + ITEM[16:]
    + b"\r\n0\r\n\r\n",
    "no content-length, closed": b"HTTP/1.1 200 OK\r\nDate: Sat, 28 Nov 2026 01:02:03 GMT\r\nx-amzn-RequestId: r1\r\n"
    b"Connection: close\r\n\r\n" + ITEM,
    "100 continue first": b"HTTP/1.1 100 Continue\r\n\r\n" + plain(),
    "HTTP/1.0": plain().replace(b"HTTP/1.1", b"HTTP/1.0", 1),
    "a folded header": plain(extra=b"x-folded: one\r\n two\r\n"),
}


@pytest.mark.parametrize("kind", list(UNUSUAL))
def test_an_unusual_reply_is_read_by_http_client_as_through_boto3(scripted, kind):
    # A reply only http.client should read: the same result as botocore's through
    # urllib3, and the next request on a connection of its own.
    server = scripted(
        lambda n, request: (UNUSUAL[kind], "close") if n in (1, 2) else (plain(), "keep"),
    )
    boto, wire = boto_at(server.url), Wire(boto_at(server.url))
    wire.call("get_item", dict(GET))  # 0: learnt, through boto3
    with Exchanges() as exchanges:
        through_wire = outcome(lambda: wire.call("get_item", dict(GET)))  # 1
        assert exchanges.kinds == ["lean"] and exchanges.unusual == 1
    through_boto3 = outcome(lambda: boto.get_item(**GET))  # 2
    assert through_wire == through_boto3
    assert through_wire["reply"]["Item"] == {"key": {"S": "a"}, "owner": {"S": "me"}}
    assert wire.call("get_item", dict(GET))["Item"]["owner"] == {"S": "me"}  # 3: a connection of its own


def test_a_connection_the_server_closed_while_pooled_is_made_again_by_urllib3(scripted):
    # The server closes the connection after its reply (an idle timeout, a restart):
    # the pool drops it when it is taken, and the request goes out on a new connection.
    server = scripted(lambda n, request: (plain(), "close" if n == 1 else "keep"))
    wire = Wire(boto_at(server.url))
    wire.call("get_item", dict(GET))  # learnt; the connection pooled
    with Exchanges() as exchanges:
        assert wire.call("get_item", dict(GET))["Item"]  # on it; the server closes it after the reply
        time.sleep(0.1)  # the close reaches the client
        assert wire.call("get_item", dict(GET))["Item"]  # through urlopen, on a new connection
        assert wire.call("get_item", dict(GET))["Item"]  # the new one, pooled
    assert exchanges.kinds == ["lean", "urlopen", "lean"]
    assert server.connections == 2


def test_a_reply_with_connection_close_is_the_connections_last(scripted):
    server = scripted(
        lambda n, request: (plain(extra=b"Connection: close\r\n"), "close") if n == 1 else (plain(), "keep")
    )
    wire = Wire(boto_at(server.url))
    wire.call("get_item", dict(GET))
    with Exchanges() as exchanges:
        wire.call("get_item", dict(GET))
        wire.call("get_item", dict(GET))
    assert exchanges.kinds == ["lean", "urlopen"]
    assert server.connections == 2


@pytest.mark.parametrize("then", ["silent", "reset", "cut short", "closed without a reply"])
def test_a_late_lost_or_cut_reply_raises_what_boto3_raises(scripted, then):
    # The read timeout of CLIENT_CONFIG (0.3 s) on a reply that never comes, a reset, a
    # connection closed after the request: the same exception and classification as
    # through boto3, and the connection is not reused. A reply cut short (fewer bytes
    # than its Content-Length, then the connection closed) is the one difference, as it
    # was through urlopen before: botocore reads it with enforce_content_length=False
    # and parses what came (here: a reply without its item), the wire path raises
    # ConnectionClosedError, a request that may have been applied.
    def answer(n: int, request: bytes) -> tuple[bytes, str]:
        if n not in (1, 3):
            return plain(), "keep"
        if then == "cut short":
            return plain()[:-5], "close"
        if then == "closed without a reply":
            return b"", "close"
        return b"", then

    server = scripted(answer)
    config = {"read_timeout": 0.3, "connect_timeout": 0.3}
    wire, boto = Wire(boto_at(server.url, **config)), boto_at(server.url, **config)
    wire.call("get_item", dict(GET))  # 0
    with Exchanges() as exchanges:
        started = time.monotonic()
        through_wire = outcome(lambda: wire.call("get_item", dict(GET)))  # 1
        elapsed = time.monotonic() - started
        assert exchanges.kinds == ["lean"]
    boto.get_item(**GET)  # 2
    through_boto3 = outcome(lambda: boto.get_item(**GET))  # 3
    if then == "cut short":
        assert through_boto3["reply"] == {}
        assert through_wire == outcome(lambda: (_ for _ in ()).throw(ConnectionClosedError(endpoint_url=server.url)))
    else:
        assert through_wire == through_boto3
    assert through_wire["class"] == ("ReadTimeoutError" if then == "silent" else "ConnectionClosedError")
    assert through_wire["ambiguous"] is True
    if then == "silent":
        assert 0.25 < elapsed < 3
    assert wire.call("get_item", dict(GET))["Item"]  # 4: on a new connection
    assert server.connections == 3  # the wire path's two, boto3's one


def self_signed(tmp_path: Any) -> tuple[ssl.SSLContext, str]:
    """A server context with a certificate for 127.0.0.1, and the path of that certificate (the CA bundle)."""
    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "dynlock test")])
    now = datetime.datetime.now(datetime.UTC)
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .add_extension(ski, False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), False)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_path, key_path)
    return context, str(cert_path)


def test_over_tls_the_exchange_is_on_the_pooled_tls_connection(scripted, tmp_path, monkeypatch):
    # The CA bundle from the environment, as boto3 resolves it (AWS_CA_BUNDLE): urllib3
    # makes and verifies the TLS connection, the wire path's requests go on it.
    context, bundle = self_signed(tmp_path)
    server = scripted(lambda n, request: (plain(), "keep"), tls=context)
    monkeypatch.setenv("AWS_CA_BUNDLE", bundle)
    wire = Wire(boto_at(server.url))
    wire.call("get_item", dict(GET))  # learnt: through boto3, which makes the connection
    with Exchanges() as exchanges:
        for _ in range(3):
            assert wire.call("get_item", dict(GET))["Item"]["owner"] == {"S": "me"}
    assert exchanges.kinds == ["lean"] * 3
    assert server.connections == 1


def test_a_certificate_not_trusted_fails_as_through_boto3(scripted, tmp_path):
    # Without the bundle: no connection is made, on either path, and the error is boto3's.
    context, _ = self_signed(tmp_path)
    server = scripted(lambda n, request: (plain(), "keep"), tls=context)
    boto, wire = boto_at(server.url), Wire(boto_at(server.url))
    with pytest.raises(Exception) as learnt:  # the first request of a kind is boto3's
        wire.call("get_item", dict(GET))
    assert type(learnt.value).__name__ == "SSLError"
    with Exchanges() as exchanges:
        through_wire = outcome(lambda: wire.call("get_item", dict(GET)))
    assert exchanges.kinds == ["urlopen"]
    assert through_wire == outcome(lambda: boto.get_item(**GET))
    assert through_wire["class"] == "SSLError"
