"""The wire path's HTTP exchange on urllib3's pooled connections, without urllib3's request path.

urllib3's ``urlopen`` costs about twice the CPU of the exchange itself: it writes the
request line and each header through ``http.client`` (a ``putheader`` apiece), sends
the head and the body in two writes, and parses the reply's headers with the ``email``
package. The wire path's requests are few and plain (a POST with a JSON body and a
Content-Length, replies with a Content-Length), so on a connection urllib3 has already
made and pooled, the request is written in one ``sendall`` with the bytes ``http.client``
would write, and the reply's status line, headers and body are read as ``http.client``
reads them when the reply is that plain.

urllib3 keeps everything else, and anything else:

- the pool: connections are taken with ``_get_conn()``, which drops one the server has
  closed, and given back with ``_put_conn()``, as ``urlopen`` does;
- a connection not yet made (the pool's first, or one the server closed while it was
  pooled) goes through ``urlopen``: connecting, TLS and its settings, the connect
  timeout and their errors stay urllib3's, and the connection is pooled for the next
  request; so does a request on an HTTPS connection urllib3 did not verify (urlopen
  warns of each);
- a request whose headers ``http.client`` would write otherwise (a header urllib3 adds
  or skips, a value it would reject or fold, the pool's ``proxy_headers`` that urlopen
  adds) goes through ``urlopen``; so do requests through a proxy (``exchange`` is not
  called for them);
- a reply that is not plain (a 1xx, chunked, without Content-Length, HTTP/1.0, a header
  line ``http.client`` would parse differently) is read by ``http.client``'s own
  ``HTTPResponse`` from the bytes already read and the socket, and its connection is
  closed afterwards.

Failures raise urllib3's exceptions for the same causes as ``urlopen`` with
``Retry(False)`` (botocore's), so botocore's mapping of them is unchanged: a timeout
while reading is ``ReadTimeoutError``, a reset or a reply cut short ``ProtocolError``.
The connection is then closed, as ``urlopen`` closes it. Like ``urlopen`` under
``Retry(False)``, nothing is sent twice.
"""

from __future__ import annotations

import errno
import http.client
import io
import re
from typing import Any

from urllib3.exceptions import ProtocolError
from urllib3.exceptions import ReadTimeoutError as URLLib3ReadTimeoutError
from urllib3.util.timeout import Timeout

from .hedging import Abandoned, InPlace

# http.client's checks of a header's name and value (``putheader``), and the name of a
# reply's header line as the ``email`` parser recognizes one.
_legal_header_name = re.compile(r"[^:\s][^:\r\n]*").fullmatch
_reply_header_name = re.compile(r"[\041-\071\073-\176]+").fullmatch
# Headers urllib3's ``request()`` writes itself, or writes differently, when the caller
# gives them (or does not give them): requests with any of these (or without the two
# it needs) go through urlopen.
_URLLIB3_DECIDES = frozenset({"host", "accept-encoding", "transfer-encoding"})
_MAX_HEAD = 65536  # a longer reply head is not plain: http.client's limits decide


class Reply:
    """A reply as the wire path reads it: ``status``, the header lines in order, the body,
    and whether the connection stays open after it."""

    __slots__ = ("body", "headers", "keep", "status")

    def __init__(self, status: int, headers: list[tuple[str, str]], body: bytes, keep: bool) -> None:
        self.status = status
        self.headers = headers
        self.body = body
        self.keep = keep


class _Prefixed(io.RawIOBase):
    """The bytes already read off the socket, then the socket: what ``http.client`` reads a
    reply from when the lean reading gives it up."""

    def __init__(self, prefix: bytes, sock: Any) -> None:
        self._prefix = memoryview(prefix)
        self._sock = sock

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        if self._prefix:
            n = min(len(b), len(self._prefix))
            b[:n] = self._prefix[:n]
            self._prefix = self._prefix[n:]
            return n
        return self._sock.recv_into(b)  # type: ignore[no-any-return]


class _Source:
    def __init__(self, prefix: bytes, sock: Any) -> None:
        self._file = io.BufferedReader(_Prefixed(prefix, sock))

    def makefile(self, mode: str) -> Any:
        return self._file


class Connections:
    """The request heads of one pool's connections, and the exchange on them."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self._prefixes: dict[tuple[str, str, int | None], bytes] = {}
        self._names: set[str] = set()  # request header names http.client takes as they are
        self._reply_names: dict[str, str] = {}  # reply header names the email parser takes, lower-cased

    def _prefix(self, conn: Any, target: str) -> bytes:
        """The request line, Host and Accept-Encoding, as ``http.client``'s ``putrequest`` writes them."""
        key = (target, conn.host, conn.port)
        prefix = self._prefixes.get(key)
        if prefix is None:
            host = conn.host
            try:
                host_enc = host.encode("ascii")
            except UnicodeEncodeError:
                host_enc = host.encode("idna")
            if ":" in host:
                host_enc = b"[" + host_enc + b"]"
            if conn.port != conn.default_port:
                host_enc += b":%d" % conn.port
            prefix = b"POST %s HTTP/1.1\r\nHost: %s\r\nAccept-Encoding: identity\r\n" % (
                target.encode("ascii"),
                host_enc,
            )
            if len(self._prefixes) > 16:
                self._prefixes.clear()
            self._prefixes[key] = prefix
        return prefix

    def _head(self, headers: dict[str, Any]) -> bytes | None:
        """The headers as ``http.client`` writes them, or None if urllib3 would write them otherwise."""
        lines = []
        names = self._names
        for name, value in headers.items():
            if type(value) is not str or type(name) is not str:
                return None
            if name not in names:
                lowered = name.lower()
                if lowered in _URLLIB3_DECIDES or not name.isascii() or not _legal_header_name(name):
                    return None
                if len(names) > 256:
                    names.clear()
                names.add(name)
            lines.append(f"{name}: {value}\r\n")
        text = "".join(lines)
        count = len(lines)
        # A CR or LF inside a value: http.client folds or rejects it; urlopen decides.
        if text.count("\n") != count or text.count("\r") != count or not text.isascii():
            return None
        return text.encode("ascii")

    def exchange(
        self, target: str, headers: dict[str, Any], body: bytes, timeout: Any, hedge: InPlace | None = None
    ) -> Reply | None:
        """The request and its reply on a pooled connection; None, with nothing sent, if
        it is for ``urlopen`` (no live pooled connection, headers urllib3 writes otherwise).

        ``hedge``: the request is the first copy of a hedged one (engine/hedging.py): its
        reply is waited for at most ``hedge.delay`` here, on the caller's thread, before
        ``hedge.wait`` sends a copy and waits for either; a copy that decides the race
        raises ``Abandoned`` out of here, and this connection is closed, not pooled."""
        if "Content-Length" not in headers or "User-Agent" not in headers:
            return None
        head = self._head(headers)
        if head is None:
            return None
        pool = self.pool
        if pool.proxy_headers:  # urlopen adds them to the request's headers
            return None
        t = pool.timeout if timeout is None else timeout
        if not isinstance(t, Timeout) or t.total is not None:
            return None
        read_timeout = t.read_timeout
        if read_timeout == 0:
            return None  # urlopen raises its own error for it
        conn = pool._get_conn()  # noqa: SLF001 (urllib3's pool: a connection the server closed is dropped here)
        sock = conn.sock
        if sock is None or conn.proxy is not None:
            # urlopen makes the connection, with urllib3's errors. The slot goes back empty,
            # not with this unconnected one: with every slot taken, the pool would be full
            # and warn of a connection discarded.
            conn.close()
            pool._put_conn(None)  # noqa: SLF001
            return None
        if pool.scheme != "http" and not conn.is_verified:
            pool._put_conn(conn)  # noqa: SLF001 (urlopen warns of each unverified HTTPS request)
            return None
        try:
            sock.settimeout(Timeout.resolve_default_timeout(t.connect_timeout))
            try:
                sock.sendall(self._prefix(conn, target) + head + b"\r\n" + body)
            except BrokenPipeError:
                pass  # as urllib3: the server may have replied and closed; the reply says
            except OSError as e:
                if e.errno not in (errno.ECONNRESET, errno.EPROTOTYPE):  # as urllib3: read what came
                    raise ProtocolError("Connection aborted.", e) from e
            try:
                data = None
                if hedge is not None and (read_timeout is None or hedge.delay < read_timeout):
                    # The first read waits only the hedge's delay: a prompt reply (the common
                    # case) is read here, with no thread; a late one gets its copy.
                    sock.settimeout(hedge.delay)
                    try:
                        data = sock.recv(65536)
                    except TimeoutError:
                        left = None if read_timeout is None else read_timeout - hedge.delay
                        left = hedge.wait(sock, left, lambda: self._finish(conn, sock, read_timeout))
                        sock.settimeout(None if left is None else max(left, 0.001))  # 0 would not block
                    else:
                        sock.settimeout(read_timeout)
                else:
                    sock.settimeout(read_timeout)
                reply = self._read(sock, data)
            except TimeoutError as e:
                raise URLLib3ReadTimeoutError(pool, target, f"Read timed out. (read timeout={read_timeout})") from e
            except (OSError, http.client.HTTPException) as e:
                raise ProtocolError("Connection aborted.", e) from e
        except Abandoned as abandoned:
            if not abandoned.reading:  # else its reader closes it once read
                conn.close()
            pool._put_conn(None)  # noqa: SLF001
            raise
        except BaseException:
            conn.close()
            pool._put_conn(None)  # noqa: SLF001 (as urlopen: the pool's slot back, empty)
            raise
        if not reply.keep:
            conn.close()
        pool._put_conn(conn)  # noqa: SLF001
        return reply

    def _finish(self, conn: Any, sock: Any, read_timeout: float | None) -> int:
        """The status of the reply of a first copy whose hedge won (hedging.InPlace._abandon), read
        on another thread; its connection then closed, its reply's rest unread."""
        try:
            sock.settimeout(read_timeout)
            return self._read(sock).status
        finally:
            conn.close()

    def _read(self, sock: Any, data: bytes | None = None) -> Reply:
        """The reply, if plain; else http.client's reading of it (``_unusual``). ``data``:
        its first bytes, read already."""
        if data is None:
            data = sock.recv(65536)
        end = data.find(b"\r\n\r\n")
        while end < 0:
            if not data:
                raise http.client.RemoteDisconnected("Remote end closed connection without response")
            if len(data) > _MAX_HEAD:
                return self._unusual(data, sock)
            more = sock.recv(65536)
            if not more:
                return self._unusual(data, sock)  # http.client says what a reply cut short is
            data += more
            end = data.find(b"\r\n\r\n")
        lines = data[:end].decode("iso-8859-1").split("\r\n")
        status_line = lines[0]
        # "HTTP/1.1 200 OK": another version, a 1xx, a 204 or 304 (no body, whatever the
        # headers say), too many headers, anything odd is http.client's to read.
        if (
            not status_line.startswith("HTTP/1.1 ")
            or len(status_line) < 12
            or not status_line[9:12].isdigit()
            or (len(status_line) > 12 and status_line[12] != " ")
            or status_line[9] in "01"
            or status_line[9:12] in ("204", "304")
            or len(lines) > 101
        ):
            return self._unusual(data, sock)
        status = int(status_line[9:12])
        headers = []
        length = -1
        keep = True
        known = self._reply_names
        for line in lines[1:]:
            name, colon, value = line.partition(":")
            lowered = known.get(name) if colon else None
            if lowered is None:
                if not colon or not _reply_header_name(name):
                    return self._unusual(data, sock)  # a folded line, a header the email parser would not take
                lowered = name.lower()
                if len(known) > 256:
                    known.clear()
                known[name] = lowered
            value = value.lstrip(" \t")  # as the email parser: the value's trailing spaces stay
            if lowered == "content-length":
                if length >= 0 or not value.strip().isdigit():
                    return self._unusual(data, sock)
                length = int(value)
            elif lowered == "transfer-encoding":
                return self._unusual(data, sock)
            elif lowered == "connection" and "close" in value.lower():
                keep = False
            headers.append((name, value))
        if length < 0:
            return self._unusual(data, sock)
        body = data[end + 4 :]
        while len(body) < length:
            more = sock.recv(max(length - len(body), 65536))
            if not more:
                raise http.client.IncompleteRead(body, length - len(body))
            body += more
        if len(body) > length:  # more than the reply: the connection is not at a reply's start
            body = body[:length]
            keep = False
        return Reply(status, headers, body, keep)

    @staticmethod
    def _unusual(data: bytes, sock: Any) -> Reply:
        """The reply read by http.client, from the bytes read so far and the rest of the socket."""
        response = http.client.HTTPResponse(_Source(data, sock), method="POST")  # type: ignore[arg-type]
        response.begin()
        body = response.read()
        return Reply(response.status, list(response.getheaders()), body, False)
