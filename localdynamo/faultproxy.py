"""A fault-injecting HTTP proxy for loopback tests against a local DynamoDB.

``FaultProxy`` listens on ``127.0.0.1`` (free port, see ``endpoint_url``) and
forwards every request to an upstream (moto, dynalite, ...) unchanged, except
for requests chosen to suffer a fault:

``"http500"``
    answer 500 with a DynamoDB ``InternalServerError`` body; not forwarded.
``"throttle"``
    answer 400 with ``ProvisionedThroughputExceededException``; not forwarded.
``"replicated_conflict"``
    answer 400 with ``ReplicatedWriteConflictException`` (a global table with
    multi-Region strong consistency: another Region is writing the item); not
    forwarded.  AWS does not document the status; botocore reads the code.
``"delay"``
    sleep ``delay_seconds``, then forward.  With a client read timeout shorter
    than the delay the client gives up although the write is applied upstream.
``"delay_reply"``
    forward (the request *is* applied), then hold its reply ``delay_seconds``
    before answering: a caller interrupted while it waits for the reply of a
    write that has landed.
``"reset"``
    abort the client connection (TCP RST); not forwarded.
``"drop_reply"``
    forward, read the whole upstream response (the request *is* applied), then
    close the client connection without answering.
``"http500_applied"``
    forward (the request *is* applied), then answer 500 ``InternalServerError``
    instead of the upstream's reply: the server failed after the write.
``"shift_date"``
    forward, then answer with the upstream's reply whose ``Date`` header is moved by
    ``date_offset`` seconds: an intermediary, or a front end, with a skewed clock.
``"strip_date"``
    forward, then answer with the upstream's reply without its ``Date`` header.

``rewrite_replies(operation, rewrite)`` passes the parsed JSON reply of every
forwarded ``operation`` through ``rewrite`` (say, ``Replicas`` added to DescribeTable's).

``set_dates(offset=..., strip=...)`` does the same to every reply that no fault
answers, until called again: a client whose every reply passes a skewed or
Date-less intermediary.

Faults are chosen per request, by scripted rules (``add_fault``, which take
precedence), by DynamoDB's per-partition throughput (``limit_partitions``: a token
bucket per key, reads and writes apart, see ``localdynamo/partitions.py``; a request
beyond it is answered 400 ``ProvisionedThroughputExceededException`` or
``ThrottlingException`` and counted as the fault ``"partition"``) or at random
(``set_rates``).  While ``pause()``-d every request is
reset, as if the endpoint were down.

Budget: once ``max_seconds`` have passed since ``start()`` or more than
``max_requests`` requests were seen, the proxy stops injecting faults, ignores
``pause()`` too, and becomes a plain forwarder until ``stop()``.  As a last
safety net it shuts itself down ``lifetime_seconds`` after ``start()`` (default
``max_seconds + 300``), so a forgotten proxy cannot outlive a test run.

Request log: ``FaultProxy(..., record=True)`` keeps one :class:`RequestRecord` per
request in ``proxy.log`` (wall-clock times it arrived and was answered, operation,
fault, status, parsed JSON body): what a scenario needs to explain where time went.

Keep-alive: client connections are persistent HTTP/1.1 with Content-Length
framing (responses are fully buffered).  Each forwarded request uses a fresh
upstream connection, so a stale upstream keep-alive connection can never make
the proxy itself retry (and thus duplicate) a request.  Chunked request bodies
are not supported (411); botocore always sends Content-Length.  If the
upstream cannot be reached the client gets a 502 and the error is appended to
``proxy.errors`` (as are exceptions from ``match`` predicates and handlers).
"""

from __future__ import annotations

import http.client
import json
import math
import random
import socket
import socketserver
import struct
import sys
import threading
import time
import urllib.parse
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from email.utils import formatdate, parsedate_to_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from localdynamo.partitions import Partitions

__all__ = ["FAULT_KINDS", "FaultProxy", "ProxyStats", "RequestRecord", "ScriptedFault"]

FAULT_KINDS = frozenset(
    {
        "http500",
        "throttle",
        "replicated_conflict",
        "delay",
        "delay_reply",
        "reset",
        "drop_reply",
        "http500_applied",
        "shift_date",
        "strip_date",
    }
)

_ERROR_PREFIX = "com.amazonaws.dynamodb.v20120810#"
_ERROR_REPLIES = {
    "http500": (500, "InternalServerError"),
    "http500_applied": (500, "InternalServerError"),
    "throttle": (400, "ProvisionedThroughputExceededException"),
    "replicated_conflict": (400, "ReplicatedWriteConflictException"),
}

# Per-hop headers (RFC 9110 7.6.1) describe one connection, not the message;
# ours differ on each side.  Content-Length is recomputed from the buffered body.
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "expect",
        "content-length",
    }
)

Matcher = Callable[[dict[str, Any]], bool]


@dataclass(eq=False)
class ScriptedFault:
    """Handle returned by ``FaultProxy.add_fault``; ``fired`` counts hits."""

    kind: str
    operation: str | None
    match: Matcher | None
    times: int
    delay_seconds: float | None
    date_offset: float = 0.0
    fired: int = 0

    @property
    def remaining(self) -> int:
        return self.times - self.fired

    def _applies(self, operation: str, body: dict[str, Any]) -> bool:
        if self.remaining <= 0:
            return False
        if self.operation is not None and self.operation != operation:
            return False
        return self.match is None or bool(self.match(body))


@dataclass(frozen=True)
class ProxyStats:
    """Snapshot of the proxy's counters.

    ``forwarded`` counts requests sent upstream, including ``delay`` and
    ``drop_reply`` ones.  ``faults`` is keyed by fault kind, plus ``"paused"``
    for requests reset while paused.  ``operations`` counts requests seen per
    DynamoDB operation ("" when there was no X-Amz-Target header).
    """

    requests: int = 0
    forwarded: int = 0
    faults: dict[str, int] = field(default_factory=dict)
    operations: dict[str, int] = field(default_factory=dict)
    faults_by_operation: dict[str, dict[str, int]] = field(default_factory=dict)

    def __getitem__(self, kind: str) -> int:
        """``stats["http500"]``, ``stats["forwarded"]``; 0 when absent."""
        if kind == "forwarded":
            return self.forwarded
        if kind == "requests":
            return self.requests
        return self.faults.get(kind, 0)


@dataclass
class RequestRecord:
    """One request seen by a recording proxy (``record=True``).

    ``received`` and ``answered`` are ``time.time()``: when the request was read and
    when the proxy finished with it (reply sent, connection reset or closed).
    ``upstream`` is the upstream's HTTP status for a forwarded request (the request
    was applied if it is 200) and ``reply_bytes`` the size of its reply body,
    ``status`` the status sent back to the client, None when no reply was sent.
    """

    received: float
    operation: str
    fault: str | None
    body: dict[str, Any]
    answered: float | None = None
    upstream: int | None = None
    status: int | None = None
    reply_bytes: int | None = None  # the upstream's reply body, for a forwarded request


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # The default backlog of 5 drops SYNs under a burst of concurrent clients,
    # which shows up as mysterious one-second connect delays.
    request_queue_size = 128
    proxy: FaultProxy

    def server_bind(self) -> None:
        # HTTPServer.server_bind does a reverse DNS lookup (getfqdn) we don't need.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]

    def handle_error(self, request: Any, client_address: Any) -> None:
        # Recorded for tests to assert on, instead of a traceback on stderr.
        exc = sys.exc_info()[1]
        if exc is not None:
            self.proxy._record_error(exc)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Idle keep-alive connections are dropped after this; bounds handler threads.
    timeout = 30
    # Headers and body go out in two writes; with Nagle on, the body waits for
    # the client's delayed ACK (~40 ms per request on Linux).
    disable_nagle_algorithm = True
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.server.proxy._track(self.connection, add=True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.proxy._track(self.connection, add=False)

    def handle(self) -> None:
        try:
            super().handle()
        except OSError:
            # The client went away (e.g. after its own read timeout); there is
            # nobody left to answer.
            self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _proxy_request(self) -> None:
        proxy = self.server.proxy
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self.close_connection = True  # cannot find the end of the body
            self._reply(411, b"", [])
            return
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        target = self.headers.get("X-Amz-Target") or ""
        operation = target.rpartition(".")[2]

        kind, delay, date_offset = proxy._choose(operation, body)
        record = proxy._start_record(operation, kind, body)
        try:
            self._answer(proxy, kind, delay, date_offset, body, record)
        finally:
            if record is not None:
                record.answered = time.time()

    def _answer(
        self,
        proxy: FaultProxy,
        kind: str | None,
        delay: float,
        date_offset: float | None,
        body: bytes,
        record: RequestRecord | None,
    ) -> None:
        if kind in ("reset", "paused"):
            self._abort()
            return
        if kind in _ERROR_REPLIES and kind != "http500_applied":
            self._error_reply(kind, record)
            return
        if kind == "partition":
            partitions = proxy.partitions or Partitions()  # limit_partitions(None) came in between
            self._send_error(400, partitions.error_code, partitions.error_message, record)
            return
        if kind == "delay" and proxy._stopping.wait(delay):
            self._abort()
            return

        try:
            status, reason, headers, payload = proxy._forward(self.command, self.path, list(self.headers.items()), body)
        except (OSError, http.client.HTTPException) as exc:
            proxy._record_error(exc)
            self._reply(502, f"upstream error: {exc!r}".encode(), [("Content-Type", "text/plain")])
            if record is not None:
                record.status = 502
            return
        if record is not None:
            record.upstream = status
            record.reply_bytes = len(payload)
        if kind == "delay_reply" and proxy._stopping.wait(delay):
            self._abort()
            return
        if kind == "drop_reply":
            # Plain close (FIN), unlike "reset": the reply is simply never sent.
            self.close_connection = True
            return
        if kind == "http500_applied":
            self._error_reply(kind, record)
            return
        if date_offset is not None:
            headers = _redate(headers, date_offset)
        rewrite = proxy._reply_rewrites.get(self.headers.get("X-Amz-Target", "").rpartition(".")[2])
        if rewrite is not None and status == 200:
            payload = json.dumps(rewrite(json.loads(payload))).encode()
            # botocore checks a DynamoDB reply against this checksum when it is there
            headers = [(name, value) for name, value in headers if name.lower() != "x-amz-crc32"]
        self._reply(status, payload, headers, reason=reason)
        if record is not None:
            record.status = status

    def _error_reply(self, kind: str, record: RequestRecord | None) -> None:
        status, code = _ERROR_REPLIES[kind]
        self._send_error(status, code, "injected", record)

    def _send_error(self, status: int, code: str, message: str, record: RequestRecord | None) -> None:
        payload = json.dumps({"__type": _ERROR_PREFIX + code, "message": message})
        self._reply(
            status,
            payload.encode(),
            [("Content-Type", "application/x-amz-json-1.0"), ("x-amzn-RequestId", str(uuid.uuid4()))],
        )
        if record is not None:
            record.status = status

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = do_PATCH = do_OPTIONS = _proxy_request

    def _reply(
        self,
        status: int,
        payload: bytes,
        headers: Iterable[tuple[str, str]],
        *,
        reason: str | None = None,
    ) -> None:
        # send_response_only: no Server/Date of our own, the upstream's pass through.
        self.send_response_only(status, reason)
        for name, value in headers:
            self.send_header(name, value)
        bodyless = self.command == "HEAD" or status in (204, 304) or status < 200
        if not bodyless:
            self.send_header("Content-Length", str(len(payload)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if not bodyless:
            self.wfile.write(payload)

    def _abort(self) -> None:
        # SO_LINGER(on, 0) turns the close into a RST.  The fd really closes in
        # finish(), when the last reference (rfile) goes; the server's later
        # shutdown() of the socket then fails harmlessly, so no FIN is sent.
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.connection.close()
        self.close_connection = True


class FaultProxy:
    """Loopback HTTP proxy injecting faults in front of ``upstream_url``."""

    def __init__(
        self,
        upstream_url: str,
        *,
        max_seconds: float = 300.0,
        max_requests: int = 100_000,
        seed: int | None = None,
        upstream_timeout: float = 30.0,
        lifetime_seconds: float | None = None,
        record: bool = False,
    ) -> None:
        url = urllib.parse.urlsplit(upstream_url)
        if url.scheme != "http" or not url.hostname:
            raise ValueError(f"need an http:// upstream URL, got {upstream_url!r}")
        self.upstream_url = upstream_url
        self._upstream = (url.hostname, url.port or 80)
        self.max_seconds = max_seconds
        self.max_requests = max_requests
        self.upstream_timeout = upstream_timeout
        self.lifetime_seconds = max_seconds + 300.0 if lifetime_seconds is None else lifetime_seconds

        self._lock = threading.Lock()
        self._rng = random.Random(seed)
        self._scripted: list[ScriptedFault] = []
        self._rates: list[tuple[str, float]] = []
        self._rate_delay: float | None = None
        self._rate_operations: frozenset[str] | None = None
        self._date_offset: float | None = None  # set_dates: NaN strips the header
        self._reply_rewrites: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {}
        self._paused = False
        self.partitions: Partitions | None = None
        self._requests = 0
        self._forwarded = 0
        self._faults: Counter[str] = Counter()
        self._operations: Counter[str] = Counter()
        self._op_faults: dict[str, Counter[str]] = {}
        self.errors: list[BaseException] = []
        self.record = record
        self.log: list[RequestRecord] = []

        self._conns: set[socket.socket] = set()
        self._conns_cond = threading.Condition(self._lock)
        self._stopping = threading.Event()
        self._started_at: float | None = None
        self._thread: threading.Thread | None = None
        self._timer: threading.Timer | None = None
        self._stopped = False

        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.proxy = self
        host, port = self._server.server_address[:2]
        self.endpoint_url = f"http://{host}:{port}"

    # -- lifecycle --------------------------------------------------------

    def start(self) -> FaultProxy:
        with self._lock:
            if self._thread is not None or self._stopped:
                raise RuntimeError("FaultProxy can only be started once")
            self._started_at = time.monotonic()
            self._thread = threading.Thread(
                target=self._server.serve_forever,
                kwargs={"poll_interval": 0.05},
                name=f"faultproxy-{self.endpoint_url}",
                daemon=True,
            )
            self._timer = threading.Timer(self.lifetime_seconds, self.stop)
            self._timer.daemon = True
            # Started under the lock: stop() must never shutdown() a server
            # whose serve_forever has not begun (it would wait forever).
            self._thread.start()
            self._timer.start()
        return self

    def stop(self, timeout: float = 2.0) -> None:
        """Stop serving and drop client connections; idempotent, bounded."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            thread, timer = self._thread, self._timer
        self._stopping.set()
        if timer is not None:
            timer.cancel()
        if thread is not None:
            self._server.shutdown()  # returns within poll_interval
            thread.join(timeout)
        self._server.server_close()
        deadline = time.monotonic() + timeout
        with self._conns_cond:
            # Wake handlers blocked reading an idle keep-alive connection.
            for conn in self._conns:
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            while self._conns and (left := deadline - time.monotonic()) > 0:
                self._conns_cond.wait(left)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- fault selection --------------------------------------------------

    def add_fault(
        self,
        kind: str,
        *,
        operation: str | None = None,
        match: Matcher | None = None,
        times: int = 1,
        delay_seconds: float | None = None,
        date_offset: float = 0.0,
    ) -> ScriptedFault:
        """Inject ``kind`` into the next ``times`` requests for ``operation``
        (None: any) whose JSON body satisfies ``match`` (None: any).
        ``date_offset``: seconds a ``"shift_date"`` fault moves the reply's ``Date`` by.

        Rules are tried in the order they were added; ``match`` runs on a
        proxy thread and gets ``{}`` for a non-JSON body.
        """
        _check_kind(kind, delay_seconds)
        if times < 1:
            raise ValueError("times must be >= 1")
        fault = ScriptedFault(kind, operation, match, times, delay_seconds, date_offset)
        with self._lock:
            self._scripted.append(fault)
        return fault

    def lose_a_break(self, attempts: int) -> ScriptedFault:
        """A break that lands unseen: the replies of its first ``attempts`` tries are
        dropped (the write is applied), and the reads after it are reset, so that it
        cannot be read back either. Reads before the break go through."""
        breaking = threading.Event()

        def is_break(body: dict[str, Any]) -> bool:
            if "#break_reason" not in body.get("UpdateExpression", ""):
                return False
            breaking.set()
            return True

        dropped = self.add_fault("drop_reply", operation="UpdateItem", match=is_break, times=attempts)
        self.add_fault("reset", operation="GetItem", match=lambda body: breaking.is_set(), times=attempts)
        return dropped

    def set_rates(
        self,
        rates: Mapping[str, float],
        *,
        delay_seconds: float | None = 0.3,
        operations: Iterable[str] | None = None,
    ) -> None:
        """Give each request (of ``operations``; None: all) at most one random
        fault, ``rates[kind]`` being the probability of ``kind``.  Replaces
        earlier rates; ``set_rates({})`` turns random faults off."""
        for kind, rate in rates.items():
            _check_kind(kind, delay_seconds)
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"rate for {kind!r} must be within [0, 1]")
        if sum(rates.values()) > 1.0 + 1e-9:
            raise ValueError("rates add up to more than 1")
        with self._lock:
            self._rates = [(k, r) for k, r in rates.items() if r > 0]
            self._rate_delay = delay_seconds
            self._rate_operations = None if operations is None else frozenset(operations)

    def set_dates(self, *, offset: float = 0.0, strip: bool = False) -> None:
        """Move the ``Date`` of every reply no fault answers by ``offset`` seconds, or
        (``strip``) leave it out; ``set_dates()`` passes it through again."""
        with self._lock:
            self._date_offset = math.nan if strip else (offset or None)

    def rewrite_replies(self, operation: str, rewrite: Callable[[dict[str, Any]], dict[str, Any]] | None) -> None:
        """Pass the parsed JSON of every successful ``operation`` reply through ``rewrite``
        (None: stop), as a server with other features would answer."""
        with self._lock:
            if rewrite is None:
                self._reply_rewrites.pop(operation, None)
            else:
                self._reply_rewrites[operation] = rewrite

    def limit_partitions(self, partitions: Partitions | None) -> None:
        """Throttle requests beyond each key's throughput (``Partitions(read_units=30,
        write_units=10)``), or stop with ``None``. Its counters: ``partitions.counts()``."""
        with self._lock:
            self.partitions = partitions

    def clear_faults(self) -> None:
        """Forget scripted faults and random rates (pause is kept)."""
        with self._lock:
            self._scripted.clear()
            self._rates = []

    def pause(self) -> None:
        """Reset every new request until ``resume()``: the endpoint is "down"."""
        with self._lock:
            self._paused = True

    def resume(self) -> None:
        with self._lock:
            self._paused = False

    # -- observation ------------------------------------------------------

    @property
    def stats(self) -> ProxyStats:
        with self._lock:
            return ProxyStats(
                requests=self._requests,
                forwarded=self._forwarded,
                faults=dict(self._faults),
                operations=dict(self._operations),
                faults_by_operation={op: dict(c) for op, c in self._op_faults.items()},
            )

    @property
    def requests_seen(self) -> int:
        with self._lock:
            return self._requests

    @property
    def injecting(self) -> bool:
        """False once the fault budget (time or requests) is spent."""
        with self._lock:
            return self._within_budget()

    # -- internals (called from handler threads) --------------------------

    def _within_budget(self) -> bool:
        started = self._started_at
        return (
            started is not None
            and time.monotonic() - started < self.max_seconds
            and self._requests <= self.max_requests
        )

    def _choose(self, operation: str, raw_body: bytes) -> tuple[str | None, float, float | None]:
        """Count the request and pick its fault: (kind or None, delay, how to redate its
        reply: None to pass the Date through, NaN to strip it, else seconds to move it by)."""
        body = _parse_body(raw_body) if raw_body else {}
        with self._lock:
            self._requests += 1
            self._operations[operation] += 1
            kind: str | None = None
            delay = 0.0
            date_offset: float | None = None
            if self._within_budget():
                date_offset = self._date_offset
                if self._paused:
                    kind = "paused"
                for fault in self._scripted if kind is None else ():
                    try:
                        applies = fault._applies(operation, body)
                    except Exception as exc:  # a buggy predicate must not fault a request
                        self.errors.append(exc)
                        continue
                    if applies:
                        fault.fired += 1
                        kind, delay = fault.kind, fault.delay_seconds or 0.0
                        if kind == "shift_date":
                            date_offset = fault.date_offset
                        elif kind == "strip_date":
                            date_offset = math.nan
                        break
                if (
                    kind is None
                    and self._rates
                    and (self._rate_operations is None or operation in self._rate_operations)
                ):
                    draw = self._rng.random()
                    for rate_kind, rate in self._rates:
                        if draw < rate:
                            kind, delay = rate_kind, self._rate_delay or 0.0
                            break
                        draw -= rate
                # Last: only a request the server would see takes its partition's units.
                if kind is None and self.partitions is not None and not self.partitions.admit(operation, body):
                    kind = "partition"
            if kind is not None:
                self._faults[kind] += 1
                self._op_faults.setdefault(operation, Counter())[kind] += 1
            return kind, delay, date_offset

    def _start_record(self, operation: str, kind: str | None, raw_body: bytes) -> RequestRecord | None:
        if not self.record:
            return None
        record = RequestRecord(time.time(), operation, kind, _parse_body(raw_body) if raw_body else {})
        with self._lock:
            self.log.append(record)
        return record

    def _forward(
        self, method: str, path: str, headers: list[tuple[str, str]], body: bytes
    ) -> tuple[int, str, list[tuple[str, str]], bytes]:
        with self._lock:
            self._forwarded += 1
        conn = http.client.HTTPConnection(*self._upstream, timeout=self.upstream_timeout)
        try:
            conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
            has_host = False
            for name, value in headers:
                if name.lower() in _HOP_BY_HOP:
                    continue
                has_host = has_host or name.lower() == "host"
                conn.putheader(name, value)
            if not has_host:
                conn.putheader("Host", "{}:{}".format(*self._upstream))
            if body or method not in ("GET", "HEAD", "DELETE", "OPTIONS"):
                conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body or None)
            resp = conn.getresponse()
            payload = resp.read()
            keep = [(k, v) for k, v in resp.getheaders() if k.lower() not in _HOP_BY_HOP]
            if method == "HEAD" and resp.getheader("Content-Length") is not None:
                keep.append(("Content-Length", resp.getheader("Content-Length", "")))
            return resp.status, resp.reason, keep, payload
        finally:
            conn.close()

    def _track(self, conn: socket.socket, *, add: bool) -> None:
        with self._conns_cond:
            if add:
                self._conns.add(conn)
            else:
                self._conns.discard(conn)
                self._conns_cond.notify_all()

    def _record_error(self, exc: BaseException) -> None:
        with self._lock:
            self.errors.append(exc)


def _check_kind(kind: str, delay_seconds: float | None) -> None:
    if kind not in FAULT_KINDS:
        raise ValueError(f"unknown fault kind {kind!r}; expected one of {sorted(FAULT_KINDS)}")
    if kind in ("delay", "delay_reply") and (delay_seconds is None or delay_seconds < 0):
        raise ValueError(f"a {kind} fault needs delay_seconds >= 0")


def _redate(headers: list[tuple[str, str]], offset: float) -> list[tuple[str, str]]:
    """The reply's headers with its Date moved by ``offset`` seconds (NaN: without a Date)."""
    kept = [(name, value) for name, value in headers if name.lower() != "date"]
    if math.isnan(offset):
        return kept
    for name, value in headers:
        when = parsedate_to_datetime(value) if name.lower() == "date" else None
        if when is not None:
            kept.append((name, formatdate(when.timestamp() + offset, usegmt=True)))
    return kept


def _parse_body(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}
