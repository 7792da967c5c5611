"""The requests to one lock table: sending, quick retries, and what a failure means.

Every API call of the engine goes through a :class:`Store`. It knows nothing of
leases: it sends what ``requests.py`` built, retries transient failures, turns
botocore's exceptions into typed errors, and feeds each reply's ``Date`` header to
the client's view of DynamoDB's clock.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError, HTTPClientError

from ..exceptions import DynLockError
from . import observe
from . import requests as rq
from .clock import ServerClock, monotonic, reply_date
from .connection import build_boto_client
from .failures import (
    THROTTLING_CODES,
    error_code,
    is_throttling,
    may_have_applied,
    raised_into,
    safe_endpoint,
    translate,
)
from .hedging import Abandoned, Hedger
from .options import ClientOptions
from .wire import Wire

logger = logging.getLogger("django_dynlock")

# The failures that are answers, not faults: a condition that did not hold.
CONDITION_FAILED = ("ConditionalCheckFailedException", "TransactionCanceledException")


def backoff(options: ClientOptions, attempt: int) -> float:
    """The pause before retry number ``attempt`` (from 0).

    Equal jitter: never zero, never in lockstep with other clients. The doubling stops
    once it passes the cap: 2**1024 is past what a float holds, and a long wait polls more often.
    """
    step = options.min_retry_delay
    for _ in range(attempt):
        if step >= options.max_retry_delay:
            break
        step *= 2
    cap: float = min(options.max_retry_delay, step)
    return cap / 2 + random.uniform(0, cap / 2)


class Store:
    """One table's requests, on one low-level boto3 client (built on first use).

    ``check_open`` runs before every request: the owning client raises there once
    it is closed, and notices a fork.
    """

    def __init__(
        self, options: ClientOptions, clock: ServerClock, *, boto_client: Any = None, check_open: Callable[[], None]
    ):
        self.options = options
        self.clock = clock
        self._boto = boto_client
        self._wire: Wire | None = None
        self._hedger: Hedger | None = None
        self._check_open = check_open
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._said: set[str] = set()
        # What the server supports, learnt on first use (dynalite lacks both).
        self.returns_item_on_failure: bool | None = None
        self.has_transactions: bool | None = None

    def learn_transactions(self, supported: bool) -> None:
        """What a TransactWriteItems told of the server: whether it has transactions."""
        self.has_transactions = supported

    def fresh_copy(self, clock: ServerClock) -> Store:
        """For a forked child: what was learnt of the server, and no boto3 client (its
        connections are the parent's). The first store keeps the boto3 client it was given."""
        if self._pid == os.getpid():
            self.clock = clock
            return self
        store = Store(self.options, clock, check_open=self._check_open)
        store.returns_item_on_failure = self.returns_item_on_failure
        store.has_transactions = self.has_transactions
        return store

    @property
    def boto(self) -> Any:
        """The low-level boto3 DynamoDB client (thread-safe)."""
        self._check_open()
        if self._boto is None:
            with self._lock:
                if self._boto is None:
                    try:
                        self._boto = build_boto_client(self.options)
                    except BotoCoreError as exc:  # no region, an unknown profile, ...
                        raise self.translate(exc, "build the DynamoDB client") from exc
        return self._boto

    @property
    def wire(self) -> Wire | None:
        """The wire path on the boto3 client (engine/wire.py); None when WIRE is "boto3"."""
        if self.options.wire == "boto3":
            return None
        if self._wire is None:
            boto = self.boto
            with self._lock:
                if self._wire is None:
                    self._wire = Wire(boto)
        return self._wire

    @property
    def hedger(self) -> Hedger | None:
        """Who sends the requests that may be hedged (engine/hedging.py); None when HEDGE_AFTER is None."""
        if self.options.hedge_after is None:
            return None
        if self._hedger is None:
            with self._lock:
                if self._hedger is None:
                    self._hedger = Hedger(self.options.hedge_after, name=f"dynlock-{self.options.alias}-hedge")
        return self._hedger

    def close(self) -> None:
        """Stop the hedges' threads (requests in flight finish)."""
        if self._hedger is not None:
            self._hedger.shutdown()

    @property
    def built(self) -> bool:
        """Whether the boto3 client exists yet (building it reads files: not on an event loop)."""
        return self._boto is not None

    @property
    def region(self) -> str | None:
        """The region as boto3 resolved it (it may come from the host's environment), once built."""
        return self._boto.meta.region_name if self._boto is not None else self.options.region_name

    def access_key_id(self) -> str | None:
        """The public id of the keys the boto3 client signs with (never the secret), once built."""
        # botocore has no public accessor on a client. Called after a reply: the
        # credentials were resolved to sign that request already.
        credentials = getattr(self._boto, "_get_credentials", lambda: None)()
        key_id = getattr(credentials, "access_key", None)
        return key_id if isinstance(key_id, str) else None

    def say_once(self, topic: str, message: str, *args: Any) -> None:
        """Log a warning about the server once per client, not once per call."""
        if topic not in self._said:
            self._said.add(topic)
            logger.warning(message, *args)

    def call(
        self,
        operation: str,
        action: str,
        *,
        attempts: int | None = None,
        table: bool = True,
        throttled_for: float = 0.0,
        hedge: bool = False,
        late: Callable[[dict[str, Any]], None] | None = None,
        **params: Any,
    ) -> dict[str, Any]:
        """One API request, retried quickly on transient failures.

        A failed condition is raised as the ClientError it is; every other botocore
        failure becomes a DynLockError whose ``ambiguous`` says whether any attempt
        may have been applied. We retry here rather than in botocore, whose backoff
        sleeps up to a second: every write of ours is safe to repeat, because its
        condition recognises our own earlier success.

        ``throttled_for``: for this many seconds a throttled request is tried again
        (MAX_RETRY_DELAY apart at most) without using up ``attempts``. A renewal's: a
        throttled partition serves whoever asks when its units come back, and waiters
        that back off leave them to a holder that keeps asking.

        ``hedge``: a copy of the request may go out while the first is late, the first
        answer winning (engine/hedging.py): only for a request whose duplicate, landing
        in either order, the protocol survives; ``late`` is told of a copy applied after
        the other had won (Hedger.send).
        """
        if table:
            params["TableName"] = self.options.table_name
        attempts = attempts or self.options.call_attempts
        patient_until = monotonic() + throttled_for
        ambiguous = False  # any attempt may have been applied, not only the last one
        failures = throttles = 0
        while True:
            try:
                return self.send(operation, params, hedge=hedge, late=late)
            except ClientError as exc:
                if error_code(exc) in CONDITION_FAILED:
                    raise
                error = self.translate(exc, action)
            except BotoCoreError as exc:
                error = self.translate(exc, action)
            ambiguous = ambiguous or error.ambiguous  # type: ignore[attr-defined]
            if getattr(error, "retryable", False) and is_throttling(error):
                delay = backoff(self.options, throttles)
                throttles += 1
                if monotonic() + delay < patient_until:
                    time.sleep(delay)
                    continue
            failures += 1
            if not getattr(error, "retryable", False) or failures >= attempts:
                error.ambiguous = ambiguous  # type: ignore[attr-defined]
                raise error
            time.sleep(backoff(self.options, failures - 1))

    def send(
        self,
        operation: str,
        params: dict[str, Any],
        *,
        hedge: bool = False,
        late: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """One request, on the wire path (or the boto3 client's method: WIRE); its reply's
        Date header narrows our view of DynamoDB's clock. ``hedge``: see ``call``.
        """
        hedger = self.hedger if hedge else None
        if hedger is None:
            return self._send_one(operation, params)
        self._check_open()
        wire = self.wire
        if wire is not None and wire.lean(operation):
            return hedger.send_in_place(self._send_one, operation, params, late)
        return hedger.send(self._send_one, operation, params, late)

    def _send_one(self, operation: str, params: dict[str, Any]) -> dict[str, Any]:
        """One copy of a request: ``send`` without the hedge.

        An exception the caller's own code raised into the request (a signal handler, a
        soft time limit) is raised as it was, not as botocore wrapped it: it is not the
        network's, and nothing retries it. The request may have been applied: the
        callers' undo assumes so of any exception they do not know (acquiring.py).
        """
        wire = self.wire
        sent = monotonic()
        own: BaseException | None = None
        try:
            reply: dict[str, Any] = (
                getattr(self.boto, operation)(**params) if wire is None else wire.call(operation, params)
            )
        except ClientError as exc:
            if observe.OBSERVERS:
                self._tell(operation, sent, error_code(exc))
            date = reply_date(exc.response)
            if date is not None:  # an error without one may be an intermediary's: it says nothing of DynamoDB
                self.clock.observe(sent, monotonic(), date)
            raise
        except HTTPClientError as exc:
            if observe.OBSERVERS:
                self._tell(operation, sent, "")
            own = raised_into(exc)
            if own is None:
                raise
        except Abandoned:
            raise  # a hedged first copy whose copy won: no outcome of its own (engine/hedging.py)
        except BaseException:
            if observe.OBSERVERS:  # no reply: the endpoint unreachable, or the caller's own exception
                self._tell(operation, sent, "")
            raise
        if own is not None:
            raise own  # outside the handler: the caller's exception, with no wrapper as its context
        if observe.OBSERVERS:
            self._tell(operation, sent, None)
        self.clock.observe(sent, monotonic(), reply_date(reply))
        return reply

    def _tell(self, operation: str, sent: float, code: str | None) -> None:
        """The observers' word of one request: ``code`` None for a reply, an error code for
        an error reply, "" for none (a network failure)."""
        if code is None:
            outcome = "ok"
        elif code in CONDITION_FAILED:
            outcome = "condition_failed"
        elif code in THROTTLING_CODES:
            outcome = "throttled"
        else:
            outcome = "error"
        observe.tell_request(self.options.alias, observe.operation_name(operation), outcome, monotonic() - sent)

    def translate(self, exc: BaseException, action: str) -> DynLockError:
        """The typed error for a botocore failure, with ``ambiguous`` (may it have been applied?)."""
        error = translate(
            exc,
            table=self.options.table_name,
            endpoint=self.options.endpoint_url,
            action=action,
            region=self.region,
            key_attribute=self.options.key_attribute,
            access_key_id=self.access_key_id,
        )
        error.ambiguous = may_have_applied(exc)  # type: ignore[attr-defined]
        return error

    def get_item(self, stored_key: str, *, attempts: int | None = None) -> dict[str, Any] | None:
        """One consistent read of a key's item (``attempts=1`` in a waiting loop, which is its own retry)."""
        reply = self.call(
            "get_item",
            "read a lock",
            attempts=attempts,
            hedge=True,
            Key=rq.key(self.options, stored_key),
            ConsistentRead=True,
        )
        item: dict[str, Any] | None = reply.get("Item")
        return item

    def old_item(
        self, exc: ClientError, stored_key: str, *, read: bool = True, attempts: int | None = None
    ) -> dict[str, Any] | None:
        """The item that made a condition fail: from the reply, or (if ``read``) one consistent read."""
        item: dict[str, Any] | None = exc.response.get("Item")
        if item is not None:
            self.returns_item_on_failure = True
            return item
        if not read:
            return None
        if self.returns_item_on_failure is None:
            self.returns_item_on_failure = False
            self.say_once(
                "no-item",
                "DynamoDB server at %s returns no item on a failed condition: "
                "falling back to a consistent GetItem (one extra call per busy attempt)",
                safe_endpoint(self.options.endpoint_url),
            )
        return self.get_item(stored_key, attempts=attempts)

    def try_update(
        self, action: str, *, attempts: int | None = None, hedge: bool = False, **params: Any
    ) -> bool | None:
        """A best-effort write: True if applied, False if its condition failed, None if DynamoDB could not be reached."""
        stored = params["Key"][self.options.key_attribute]["S"]
        try:
            self.call("update_item", action, attempts=attempts, hedge=hedge, **params)
        except ClientError:
            return False
        except DynLockError as exc:
            # It may have meant to free a key that stays held until its expiry passes.
            logger.warning("could not %s of %r: %s", action, stored, exc)
            return None
        return True
