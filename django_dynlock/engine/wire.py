"""The engine's requests to DynamoDB without botocore's per-request machinery.

botocore spends about 0.6 ms of CPU on each ``UpdateItem`` validating the parameters
against the service model, serializing them, resolving the endpoint's rules, emitting
a dozen events and parsing the reply shape by shape. The engine sends a handful of
request shapes whose parameters are already DynamoDB's wire JSON (typed attribute
values), so the body is ``json.dumps`` of them, as botocore's serializer would write it.

Everything that decides what the request is stays boto3's and botocore's:

- The URL, the headers botocore sets (``X-Amz-Target``, ``Content-Type``, the user agent
  with its feature ids, ``amz-sdk-request``) and the signing name and region are learnt
  once per operation from botocore itself: the first request of each kind is sent by
  the boto3 client, and its ``before-send`` shows what botocore made of it.
- The signature is botocore's ``SigV4Auth`` with the client's credentials, frozen per
  request with ``get_frozen_credentials()`` as botocore's signer does, so refreshable
  credentials (instance roles, SSO, assume-role) are refreshed as boto3 refreshes them.
  What repeats between requests is kept (``_SigV4``): the signing key, the Host, path
  and query of a URL, each header's canonical line, each computed by botocore's own code.
- The request goes through the client's own ``URLLib3Session``: its connection pool,
  proxies, TLS verification and CA bundle, timeouts, and its mapping of transport
  failures to botocore's exceptions. On a live pooled connection without a proxy, the
  exchange itself is engine/exchange.py's (the bytes urllib3 writes, in one write; the
  reply read as http.client reads a plain one); a new connection, a proxy and any
  request or reply out of the ordinary go through urllib3's ``urlopen``.
- The client's events are emitted as botocore emits them (``provide-client-params``,
  ``before-parameter-build``, ``before-call``, ``before-send``, ``after-call``), so
  botocore's own handlers (the
  idempotency token of a transaction, the recursion-detection header) and the user's
  (counting calls, tracing, a stub answering ``before-send``) still see each request.
- An error reply (status 300 or more) is parsed by the client's own parser and raised
  as the client's modelled ``ClientError``: the same code, message, status, item on a
  failed condition and cancellation reasons, so every classification in failures.py
  holds. A success is parsed with ``json`` (the engine's items hold no binary values,
  the one type botocore would decode), with botocore's ``ResponseMetadata``.

``WIRE = "boto3"`` in an alias (``wire="boto3"`` in ClientOptions) sends every
request through the boto3 client instead.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import uuid
from concurrent.futures import CancelledError
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from botocore.auth import SIGNED_HEADERS_BLACKLIST, SigV4Auth, _host_from_url
from botocore.awsrequest import AWSPreparedRequest
from botocore.exceptions import (
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    HTTPClientError,
    NoCredentialsError,
    ProxyConnectionError,
    ReadTimeoutError,
    SSLError,
)
from botocore.hooks import first_non_none_response
from botocore.httpsession import mask_proxy_url
from botocore.utils import ensure_boolean
from urllib3 import HTTPHeaderDict
from urllib3.exceptions import ConnectTimeoutError as URLLib3ConnectTimeoutError
from urllib3.exceptions import NewConnectionError, ProtocolError, ProxyError
from urllib3.exceptions import ReadTimeoutError as URLLib3ReadTimeoutError
from urllib3.exceptions import SSLError as URLLib3SSLError
from urllib3.util.retry import Retry

from .exchange import Connections
from .hedging import take_first

# The requests the engine sends on every lock operation, by boto3 method name. Table
# administration (create, describe, TTL) stays boto3's: it is rare and its replies
# carry timestamps botocore parses.
OPERATIONS = {
    "update_item": "UpdateItem",
    "get_item": "GetItem",
    "batch_get_item": "BatchGetItem",
    "transact_write_items": "TransactWriteItems",
    "put_item": "PutItem",
    "delete_item": "DeleteItem",
    "query": "Query",
    "scan": "Scan",
}

# Headers set per request by signing and by the endpoint (the template is without them).
_PER_REQUEST = frozenset(
    {
        "authorization",
        "x-amz-date",
        "x-amz-security-token",
        "amz-sdk-invocation-id",
        "content-length",
        "x-amzn-trace-id",
    }
)


@dataclass(frozen=True)
class Template:
    """What botocore makes of one operation, besides its body and signature."""

    url: str
    headers: tuple[tuple[str, str], ...]  # botocore's, in its order, before signing
    sdk_request: str | None  # amz-sdk-request: attempt and max, as botocore's retry handler writes it
    signing_name: str
    region: str
    auth_path: str | None


_NO_RETRIES = Retry(False)


class _Reply:
    """The reply as botocore's handlers read an ``AWSResponse``: ``status_code``, ``headers``
    (case-insensitive, made when first read), ``content``, ``raw`` (urllib3's response, or
    None when the reply was read on a pooled connection: engine/exchange.py)."""

    __slots__ = ("_headers", "content", "pairs", "raw", "status_code", "url")

    def __init__(self, url: str, status: int, pairs: list[tuple[str, str]], content: bytes, raw: Any = None) -> None:
        self.url = url
        self.raw = raw
        self.status_code = status
        self.pairs = pairs  # the header lines, in order
        self.content = content
        self._headers: HTTPHeaderDict | None = raw.headers if raw is not None else None

    @property
    def headers(self) -> HTTPHeaderDict:
        if self._headers is None:
            headers = HTTPHeaderDict()
            for name, value in self.pairs:
                headers.add(name, value)
            self._headers = headers
        return self._headers

    @property
    def text(self) -> str:
        return self.content.decode("utf-8")

    def lowered(self) -> dict[str, str]:
        """The headers by lower-case name, the last of a repeated one (botocore's ``HTTPHeaders`` metadata)."""
        return {k.lower(): v for k, v in self.pairs}


class _Signable:
    """What botocore's ``SigV4Auth.add_auth`` reads and writes of an ``AWSRequest``, without
    its email-based header map and the ``prepare()`` that each read of its ``body`` costs."""

    __slots__ = ("auth_path", "body", "context", "headers", "method", "params", "url")

    def __init__(
        self, url: str, headers: dict[str, str], body: bytes, context: dict[str, Any], auth_path: str | None
    ) -> None:
        self.method = "POST"
        self.url = url
        self.headers = headers
        self.body = body
        self.params: dict[str, str] = {}
        self.context = context
        self.auth_path = auth_path


class _HeaderMap(dict[str, list[str]]):
    """What ``SigV4Auth.canonical_headers`` and ``signed_headers`` read of ``headers_to_sign``'s
    ``HTTPHeaders`` (an ``email`` message): the names, and ``get_all`` of each."""

    def get_all(self, name: str, failobj: Any = None) -> Any:
        return self.get(name, failobj)


class _SigV4(SigV4Auth):
    """botocore's ``SigV4Auth``, all of its steps its own, with what repeats between
    requests kept by the ``Wire``: the signing key (four HMACs, the same all day for one
    secret, region and service), the Host header of a URL, its canonical path and query,
    each header's canonical line (botocore's ``canonical_headers`` of that header alone);
    and the headers to sign and their names taken once per request (botocore takes them
    twice, into an ``email`` message)."""

    def __init__(self, credentials: Any, service_name: str, region_name: str, wire: Wire) -> None:
        super().__init__(credentials, service_name, region_name)
        self._wire = wire
        self._to_sign: tuple[Any, _HeaderMap] | None = None
        self._signed: tuple[Any, str] | None = None

    def headers_to_sign(self, request: Any) -> Any:
        if self._to_sign is not None and self._to_sign[0] is request:
            return self._to_sign[1]  # the second time in one add_auth: the headers have not changed
        header_map = _HeaderMap()
        for name, value in request.headers.items():
            lname = name.lower()
            if lname not in SIGNED_HEADERS_BLACKLIST:
                header_map.setdefault(lname, []).append(value)
        if "host" not in header_map:
            header_map["host"] = [self._wire.url_part("host", request.url, _host_from_url)]
        self._to_sign = (request, header_map)
        return header_map

    def canonical_headers(self, headers_to_sign: Any) -> str:
        kept = self._wire.canonical_lines
        lines = []
        for key in sorted(headers_to_sign):
            values = headers_to_sign[key]
            if len(values) != 1:  # the same header twice, in two cases: botocore's join
                return super().canonical_headers(headers_to_sign)  # type: ignore[no-any-return]
            line = kept.get((key, values[0]))
            if line is None:
                line = super().canonical_headers(_HeaderMap({key: values}))
                if len(kept) > 256:  # X-Amz-Date's line changes every second
                    kept.clear()
                kept[(key, values[0])] = line
            lines.append(line)
        return "\n".join(lines)

    def signed_headers(self, headers_to_sign: Any) -> str:
        if self._signed is not None and self._signed[0] is headers_to_sign:
            return self._signed[1]
        signed: str = super().signed_headers(headers_to_sign)
        self._signed = (headers_to_sign, signed)
        return signed

    def canonical_query_string(self, request: Any) -> str:
        if request.params:
            return super().canonical_query_string(request)  # type: ignore[no-any-return]
        return self._wire.url_part(
            "query", request.url, lambda url: super(_SigV4, self).canonical_query_string(request)
        )

    def _normalize_url_path(self, path: str) -> str:
        return self._wire.url_part("path", path, super()._normalize_url_path)

    def signature(self, string_to_sign: str, request: Any) -> str:
        day = request.context["timestamp"][0:8]
        scope = (self.credentials.secret_key, day, self._region_name, self._service_name)
        kept = self._wire.signing_key
        if kept is not None and kept[0] == scope:
            return self._sign(kept[1], string_to_sign, hex=True)  # type: ignore[no-any-return]
        k_date = self._sign(f"AWS4{scope[0]}".encode(), day)
        k_region = self._sign(k_date, self._region_name)
        k_service = self._sign(k_region, self._service_name)
        k_signing = self._sign(k_service, "aws4_request")
        self._wire.signing_key = (scope, k_signing)
        return self._sign(k_signing, string_to_sign, hex=True)  # type: ignore[no-any-return]


class Wire:
    """The engine's requests on one boto3 DynamoDB client (thread-safe)."""

    def __init__(self, boto_client: Any) -> None:
        self._client = boto_client
        self._events = boto_client.meta.events
        self._session = boto_client._endpoint.http_session  # noqa: SLF001 (botocore's own pool: see the module's docstring)
        self._parser = boto_client._response_parser  # noqa: SLF001
        self._endpoint = boto_client._endpoint  # noqa: SLF001
        self._signer = boto_client._request_signer  # noqa: SLF001
        self._service = boto_client.meta.service_model
        self._models = {name: self._service.operation_model(op) for name, op in OPERATIONS.items()}
        self._templates: dict[str, Template | None] = {}
        self._learning = threading.local()
        self._lock = threading.Lock()
        self._sid = self._service.service_id.hyphenize()
        self.signing_key: tuple[tuple[str, str, str, str], bytes] | None = None  # _SigV4's
        self.canonical_lines: dict[tuple[str, str], str] = {}  # _SigV4's
        self._url_parts: dict[tuple[str, str], str] = {}
        self._routes: dict[str, tuple[Any, Connections | None, str | None, str]] = {}
        uid = f"dynlock-wire-{id(self)}"
        # First at before-send: the headers as botocore made them, before a user's handler sees them.
        self._events.register("before-sign.dynamodb", self._on_sign, unique_id=f"{uid}-sign")
        self._events.register_first("before-send.dynamodb", self._on_send, unique_id=f"{uid}-send")

    # -- learning an operation's template -------------------------------------------------
    def _on_sign(self, request: Any, signing_name: str, region_name: str, signature_version: Any, **_: Any) -> None:
        seen = getattr(self._learning, "seen", None)
        if seen is None:
            return
        signing = request.context.get("signing", {})
        seen["signature_version"] = signature_version
        seen["signing_name"] = signing.get("signing_name") or signing_name
        seen["region"] = signing.get("region") or region_name
        seen["custom_identity"] = bool(signing.get("request_credentials") or signing.get("identity_cache"))
        seen["auth_path"] = request.auth_path

    def _on_send(self, request: Any, **_: Any) -> None:
        seen = getattr(self._learning, "seen", None)
        if seen is None:
            return
        seen["url"] = request.url
        seen["headers"] = [(k, v.decode() if isinstance(v, bytes) else v) for k, v in request.headers.items()]

    def call(self, operation: str, params: dict[str, Any]) -> dict[str, Any]:
        """``boto_client.<operation>(**params)``, sent on the wire path once it has the operation's template."""
        template = self._templates.get(operation)
        if template is not None:
            return self._send(operation, template, dict(params))
        method = getattr(self._client, operation)
        if operation not in OPERATIONS or operation in self._templates:  # None: botocore does not sign it as we would
            return method(**params)  # type: ignore[no-any-return]
        seen: dict[str, Any] = {}
        self._learning.seen = seen
        try:
            return method(**params)  # type: ignore[no-any-return]
        finally:
            self._learning.seen = None
            if "url" in seen:  # it reached before-send, whatever came after
                with self._lock:
                    self._templates.setdefault(operation, self._template(seen))

    @staticmethod
    def _template(seen: dict[str, Any]) -> Template | None:
        """What a request botocore sent shows of its operation; None if it was not signed with SigV4 as we sign."""
        if seen.get("signature_version") != "v4" or seen.get("custom_identity") or not seen.get("region"):
            return None
        headers = tuple((k, v) for k, v in seen["headers"] if k.lower() not in _PER_REQUEST)
        sdk_request = next((v for k, v in headers if k.lower() == "amz-sdk-request"), None)
        return Template(
            url=seen["url"],
            headers=tuple((k, v) for k, v in headers if k.lower() != "amz-sdk-request"),
            sdk_request=sdk_request,
            signing_name=seen["signing_name"],
            region=seen["region"],
            auth_path=seen["auth_path"],
        )

    def _send(self, operation: str, template: Template, params: dict[str, Any]) -> dict[str, Any]:
        model = self._models[operation]
        name = model.name
        events = self._events
        meta = self._client.meta
        context: dict[str, Any] = {"client_region": meta.region_name, "client_config": meta.config}
        # A handler may change the parameters or give others (ReturnConsumedCapacity, say),
        # as through boto3 (BaseClient._emit_api_params).
        responses = events.emit(
            f"provide-client-params.{self._sid}.{name}", params=params, model=model, context=context
        )
        params = first_non_none_response(responses, default=params)
        # botocore's own handlers fill in what the caller left out (a transaction's idempotency token).
        events.emit(f"before-parameter-build.{self._sid}.{name}", params=params, model=model, context=context)
        body = json.dumps(params).encode("utf-8")
        request_dict = {
            "url_path": "/",
            "query_string": "",
            "method": "POST",
            "headers": dict(template.headers),
            "body": body,
            "url": template.url,
            "context": context,
        }
        _, answer = events.emit_until_response(
            f"before-call.{self._sid}.{name}",
            model=model,
            params=request_dict,
            request_signer=self._signer,
            context=context,
        )
        if answer is not None:  # a stub's (http response, parsed)
            http, parsed = answer
        else:
            http = self._http(name, template, request_dict, context)
            parsed = self._parse(http, model)
        events.emit(f"after-call.{self._sid}.{name}", http_response=http, parsed=parsed, model=model, context=context)
        if http.status_code >= 300:
            code = parsed.get("Error", {}).get("Code")
            raise self._client.exceptions.from_code(code)(parsed, name)
        return parsed  # type: ignore[no-any-return]

    def _http(self, name: str, template: Template, request_dict: dict[str, Any], context: dict[str, Any]) -> Any:
        body = request_dict["body"]
        request = _Signable(request_dict["url"], request_dict["headers"], body, context, template.auth_path)
        credentials = self._signer._credentials  # noqa: SLF001 (what botocore's signer freezes per request)
        if credentials is None:
            raise NoCredentialsError()
        _SigV4(credentials.get_frozen_credentials(), template.signing_name, template.region, self).add_auth(request)
        headers = request.headers
        headers["amz-sdk-invocation-id"] = str(uuid.uuid4())
        if template.sdk_request is not None:
            headers["amz-sdk-request"] = template.sdk_request
        headers["Content-Length"] = str(len(body))
        prepared = AWSPreparedRequest("POST", request.url, headers, body, False)
        prepared.context = context
        responses = self._events.emit(f"before-send.{self._sid}.{name}", request=prepared)
        http = first_non_none_response(responses)
        if http is None:
            http = self._transmit(prepared)
        return http

    def lean(self, operation: str) -> bool:
        """Whether a request of ``operation`` will most likely go through the lean exchange
        (engine/exchange.py): sent on the wire path, without a proxy, with a live connection
        idle in the pool, to a verified HTTPS endpoint if HTTPS. Store.send then hedges its
        first copy in place (Hedger.send_in_place); if it goes to urlopen after all (another
        thread took the connection, the server closed it), the transmission hops to a thread."""
        template = self._templates.get(operation)
        if template is None:
            return False
        route = self._routes.get(template.url)
        if route is None or route[1] is None or route[0].pool is None:
            return False
        pool = route[0]
        idle = pool.pool.queue  # urllib3's LifoQueue: _get_conn takes the last
        conn = idle[-1] if idle else None
        return conn is not None and conn.sock is not None and (pool.scheme == "http" or conn.is_verified)

    def url_part(self, kind: str, value: str, compute: Any) -> str:
        """``compute(value)``, kept: what signing derives from the URL and its path (botocore's own functions)."""
        key = (kind, value)
        part = self._url_parts.get(key)
        if part is None:
            part = compute(value)
            if len(self._url_parts) > 64:
                self._url_parts.clear()
            self._url_parts[key] = part
        return part

    def _route(self, url: str) -> tuple[Any, Connections | None, str | None, str]:
        """The URL's pool, its lean exchange (None through a proxy), proxy and request target,
        as botocore's ``URLLib3Session.send`` finds them; kept while the pool is open (the
        pool manager closes a pool it evicts, and the session's ``close`` all of them)."""
        route = self._routes.get(url)
        if route is not None and route[0].pool is not None:
            return route
        session = self._session
        proxy_url = session._proxy_config.proxy_url_for(url)  # noqa: SLF001
        manager = session._get_connection_manager(url, proxy_url)  # noqa: SLF001
        pool = manager.connection_from_url(url)
        session._setup_ssl_cert(pool, url, session._verify)  # noqa: SLF001
        target = session._get_request_target(url, proxy_url)  # noqa: SLF001
        route = (pool, Connections(pool) if proxy_url is None else None, proxy_url, target)
        if len(self._routes) > 16:
            self._routes.clear()
        self._routes[url] = route
        return route

    def _transmit(self, request: AWSPreparedRequest) -> _Reply:
        """``URLLib3Session.send`` of botocore, less its ``AWSResponse``: the same proxy,
        pool, TLS settings and timeouts, the same exceptions for the same failures, and
        the reply read whole; on a live pooled connection, without a proxy, the exchange
        is engine/exchange.py's."""
        session = self._session
        url = request.url
        proxy_url = None
        try:
            pool, lean, proxy_url, target = self._route(url)
            if ensure_boolean(os.environ.get("BOTO_EXPERIMENTAL__ADD_PROXY_HOST_HEADER", "")):
                # As botocore: on every pool, and urlopen writes it into requests without a proxy too.
                pool.proxy_headers["host"] = urlparse(url).hostname
            timeout = session._get_request_timeout(request)  # noqa: SLF001
            hedge = take_first()  # the first copy of a hedged request (Hedger.send_in_place)
            if lean is not None:
                reply = lean.exchange(target, request.headers, request.body, timeout, hedge)
                if reply is not None:
                    return _Reply(url, reply.status, reply.headers, reply.body)
            extra: dict[str, Any] = {}
            if timeout is not None:
                extra["timeout"] = timeout

            def urlopen() -> Any:
                return pool.urlopen(
                    method="POST",
                    url=target,
                    body=request.body,
                    headers=request.headers,
                    retries=_NO_RETRIES,
                    assert_same_host=False,
                    preload_content=True,
                    decode_content=False,
                    enforce_content_length=False,
                    **extra,
                )

            # Not on a pooled connection after all: hedged on a thread, as every copy was before.
            raw = urlopen() if hedge is None else hedge.run(urlopen)
            return _Reply(url, raw.status, list(raw.headers.items()), raw.data, raw)
        except URLLib3SSLError as e:
            raise SSLError(endpoint_url=url, error=e) from None
        except (NewConnectionError, socket.gaierror) as e:
            raise EndpointConnectionError(endpoint_url=url, error=e) from None
        except ProxyError as e:
            raise ProxyConnectionError(proxy_url=mask_proxy_url(proxy_url), error=e) from None
        except URLLib3ConnectTimeoutError as e:
            raise ConnectTimeoutError(endpoint_url=url, error=e) from None
        except URLLib3ReadTimeoutError as e:
            raise ReadTimeoutError(endpoint_url=url, error=e) from None
        except ProtocolError as e:
            raise ConnectionClosedError(error=e, request=request, endpoint_url=url) from None
        except CancelledError:
            raise
        except Exception as e:
            raise HTTPClientError(error=e) from None

    def _parse(self, http: Any, model: Any) -> dict[str, Any]:
        status = http.status_code
        content = http.content
        parsed: Any = None
        if status < 300:
            try:
                parsed = json.loads(content) if content else {}
            except ValueError:
                parsed = None  # not JSON: botocore's parser decides what that means
        if not isinstance(parsed, dict):
            # botocore's own parser: an error's code, message and modelled fields (Item, CancellationReasons).
            response = {"headers": http.headers, "status_code": status, "body": content, "context": {}}
            parsed = self._parser.parse(response, model.output_shape)
            if status >= 300:
                self._endpoint._add_modeled_error_fields(response, parsed, model, self._parser)  # noqa: SLF001
        else:
            lowered = http.lowered() if isinstance(http, _Reply) else {k.lower(): v for k, v in http.headers.items()}
            metadata: dict[str, Any] = {}
            if "x-amzn-requestid" in lowered:
                metadata["RequestId"] = lowered["x-amzn-requestid"]
            metadata["HTTPStatusCode"] = status
            metadata["HTTPHeaders"] = lowered
            parsed["ResponseMetadata"] = metadata
        parsed["ResponseMetadata"]["RetryAttempts"] = 0
        return parsed  # type: ignore[no-any-return]

    def close(self) -> None:
        uid = f"dynlock-wire-{id(self)}"
        self._events.unregister("before-sign.dynamodb", unique_id=f"{uid}-sign")
        self._events.unregister("before-send.dynamodb", unique_id=f"{uid}-send")
