"""``dynamo_lock``: the decorator and context manager most users touch.

Keys are templates bound to the call's arguments (``"order:{order_id}"``,
``"invoice:{self.pk}"``) or callables; they are checked against the function's
signature when the decorator is applied, so a typo fails at import time
(``keytemplates``, which Celery's ``QueueOnce`` fills its keys with too).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import logging
import math
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar, cast

from asgiref.sync import iscoroutinefunction
from django.http import HttpRequest, HttpResponse, HttpResponseBase

from . import keytemplates
from .conf import DEFAULT_ALIAS
from .engine.client import LockClient
from .engine.keys import MAX_LIMIT
from .engine.lease import Lease, LeaseGroup, release_quietly_if_failing
from .engine.text import printable
from .exceptions import BackendError, InvalidArgument, LockLost, LockNotAcquired
from .keytemplates import (
    KeySpec,
    call_with_arguments,
    check_arguments,
    check_limit,
    check_templates,
    is_template,
    placeholders,
    resolve_keys,
)
from .registry import get_lock_client

logger = logging.getLogger("django_dynlock")

F = TypeVar("F", bound=Callable[..., Any])
Handle = Lease | LeaseGroup

RAISE, SKIP, RETRY = "raise", "skip", "retry"
ON_LOST = ("raise", "log")


@dataclass(frozen=True)
class _Held:
    """One entry of the context's stack of held locks (for current() and re-entrancy)."""

    alias: str
    keys: tuple[str, ...]
    handle: Handle
    owner: object  # the thread or asyncio task that acquired it


_held: contextvars.ContextVar[tuple[_Held, ...]] = contextvars.ContextVar("dynlock_held", default=())


def _who() -> object:
    """The current asyncio task if there is one, else the current thread."""
    try:
        task = asyncio.current_task()
    except RuntimeError:
        task = None
    return task if task is not None else threading.current_thread()


def _find_request(args: tuple[Any, ...]) -> HttpRequest | None:
    # A function view gets the request first; a method decorated directly, second.
    for arg in args[:2]:
        if isinstance(arg, HttpRequest):
            return arg
    return None


def _celery_task(args: Sequence[Any]) -> Any:
    """The Celery task this call runs in, or None. Imports nothing from Celery unless
    the program already did (a process that runs tasks has)."""
    if "celery" not in sys.modules:
        return None
    from .celery import running_task

    return running_task(args)


def _holder(
    func: Callable[..., Any] | None,
    request: HttpRequest | None,
    extra: Mapping[str, Any] | None,
    args: Sequence[Any] = (),
) -> dict[str, Any]:
    holder: dict[str, Any] = {}
    if func is not None:
        name = f"{func.__module__}.{func.__qualname__}"
        holder["view" if request is not None else "function"] = name
    task = _celery_task(args) if request is None else None
    if task is not None:
        from .celery import task_holder

        holder.update(task_holder(task))
        if holder.get("function") == holder["task"]:
            del holder["function"]  # the task's own body: its name says it once
    if request is not None:
        holder["path"] = request.path
        user = getattr(request, "user", None)
        if user is not None and getattr(user, "is_authenticated", False):
            holder["user"] = str(user.pk)
    holder.update(extra or {})
    return holder


def busy_response(error: LockNotAcquired, status: int = 423) -> HttpResponse:
    """The default answer of a view whose lock is busy: 423 Locked with Retry-After."""
    response = HttpResponse(
        f"Locked: {error.key} is busy; try again later.\n", status=status, content_type="text/plain"
    )
    # Always sent: a client that gets none retries at once. Without a hint (the key is
    # being acquired, or free but reserved for a waiter), the least: one second.
    response["Retry-After"] = str(max(1, math.ceil(error.retry_after or 0)))
    return response


# DynamoDB throttles per second; an outage or a failing server is given a little longer.
THROTTLED_CODES = frozenset({"ProvisionedThroughputExceededException", "ThrottlingException", "RequestLimitExceeded"})
THROTTLED_RETRY_AFTER, TROUBLE_RETRY_AFTER = 1, 5


def error_response(error: BackendError, status: int = 503) -> HttpResponse:
    """The default answer of a view whose lock DynamoDB could not grant or refuse in
    time (throttled, unreachable, failing): 503 Service Unavailable with Retry-After."""
    response = HttpResponse(
        "Service Unavailable: the lock service is not answering; try again later.\n",
        status=status,
        content_type="text/plain",
    )
    retry_after = THROTTLED_RETRY_AFTER if error.code in THROTTLED_CODES else TROUBLE_RETRY_AFTER
    response["Retry-After"] = str(retry_after)
    return response


# How often (seconds) the decorator writes a line about the busy and failed answers of
# one view (or function), and how many views it keeps counts for: docs/logging.md.
ANSWERS_LOG_INTERVAL = 60.0
ANSWERS_TRACKED = 1000


class AnswerLog:
    """Logs a decorator's busy (423) and failed (503) answers once per interval, with a count.

    An outage makes every request of a locked view fail the same way: a line each would
    flood the log, and Django's would mail the admins once a request (docs/logging.md).
    The first answer of a kind is logged at once; later ones are counted, and the first
    answer after ``interval`` logs the count since the line before. Counts are kept for
    ``tracked`` kinds (the least recently answered is forgotten, its count unlogged).
    Thread-safe: the views of a process share one.
    """

    def __init__(
        self,
        interval: float = ANSWERS_LOG_INTERVAL,
        tracked: int = ANSWERS_TRACKED,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.interval, self.tracked, self.clock = interval, tracked, clock
        self._lock = threading.Lock()
        # kind -> [answers not yet logged, when the last line was written]
        self._kinds: OrderedDict[tuple[str, ...], list[float]] = OrderedDict()

    def count(self, kind: tuple[str, ...]) -> tuple[int, float | None] | None:
        """Count one answer of ``kind``: (answers to log, seconds since the last line), or
        None when it is only counted. The first answer of a kind gives (1, None)."""
        now = self.clock()
        with self._lock:
            entry = self._kinds.get(kind)
            if entry is None:
                self._kinds[kind] = [0, now]
                while len(self._kinds) > self.tracked:
                    self._kinds.popitem(last=False)
                return 1, None
            self._kinds.move_to_end(kind)
            entry[0] += 1
            if now - entry[1] < self.interval:
                return None
            answers, since = int(entry[0]), now - entry[1]
            entry[0], entry[1] = 0, now
            return answers, since

    def clear(self) -> None:
        with self._lock:
            self._kinds.clear()


answers = AnswerLog()


def _log_answer(level: int, kind: tuple[str, ...], message: str, where: str, answer: str, error: Exception) -> None:
    """One line for the first answer of ``kind``, then one an interval with the count."""
    if not logger.isEnabledFor(level):
        return
    logged = answers.count(kind)
    if logged is None:
        return
    count, since = logged
    why = printable(str(error))  # it names the key and the holder: text from URLs (docs/security.md)
    if since is None:
        logger.log(level, message + ": %s", where, answer, why)
    else:
        logger.log(level, message + " %d times in the last %.0fs: %s", where, answer, count, since, why)


def _mark_logged(response: Any) -> Any:
    """Tell Django that this answer has been logged, so that its handler does not log it
    again as a ``django.request`` error (5xx, mailed to ADMINS by Django's default
    logging) or warning (4xx), once per request.

    ``_has_been_logged`` is private to Django, but it is what ``log_response`` (in
    django/utils/log.py, 5.2 to 6.1) reads and sets for exactly this: there is no
    public way to say a response was logged. Tests (tests/test_logging.py) pin it.
    """
    if isinstance(response, HttpResponseBase):
        response._has_been_logged = True
    return response


def _where(func: Callable[..., Any]) -> str:
    return f"{func.__module__}.{func.__qualname__}"


class dynamo_lock:
    """Hold DynamoDB leases around a function call or a ``with`` block.

    As a decorator: ``@dynamo_lock("order:{order_id}", wait=2)`` on functions, views,
    methods and coroutines. As a context manager: ``with dynamo_lock("export") as
    lease:``. Several keys are acquired atomically. See docs/decorator.md.

    :param keys: key templates filled from the call's arguments (``"order:{order_id}"``,
        ``"{self.pk}"``), plain keys, or callables that return a key or a list of keys;
        none: the function's dotted name.
    :param wait: seconds to wait for a busy key; None: the alias' ``WAIT_TIMEOUT``.
    :param lease: seconds the lease lasts without renewal; None: ``LEASE_DURATION``.
    :param using: the ``DYNLOCK`` alias.
    :param on_busy: what a call that finds the key busy gets: ``"raise"``
        (LockNotAcquired; the default outside views), ``"skip"`` (None, without calling),
        ``"retry"`` (a Celery task retries), an HTTP status code (views; 423 by default),
        or a callable ``(request_or_None, error)``.
    :param on_lost: ``"raise"`` LockLost after the function returns if its lease ended
        while it ran, or ``"log"`` only.
    :param on_error: what a call gets when DynamoDB is throttled, failing or unreachable
        (a retryable BackendError): ``"raise"`` (the default outside views), an HTTP
        status code (views; 503 with Retry-After by default), or a callable
        ``(request_or_None, error)``. Not accepted by a ``with`` block.
    :param reentrant: the same thread or asyncio task may re-enter a key it holds
        through ``dynamo_lock`` without a second write.
    :param holder: metadata stored with the lease (a dict of strings).
    :param quote: percent-encode each value filled into a template, so that no value
        can write the template's separator (decorators only).
    :param limit: how many calls may hold the key at once (a semaphore,
        docs/semaphores.md), 1 to 99; or a callable given the call's arguments by name,
        as a key template is (``lambda tenant_id: ...``), that returns it (decorators
        only). One key only.
    :param metrics_name: the ``name`` label of its metrics and spans. None: the key
        templates as written (``"order:{order_id}"``, several joined by ``,``), or for a
        callable key its key's prefix up to the first ``:`` (docs/observability.md).
    """

    def __init__(
        self,
        *keys: KeySpec,
        wait: float | None = None,
        lease: float | None = None,
        using: str = DEFAULT_ALIAS,
        on_busy: str | int | Callable[..., Any] | None = None,
        on_lost: str = "raise",
        on_error: str | int | Callable[..., Any] | None = None,
        reentrant: bool = False,
        holder: Mapping[str, Any] | None = None,
        quote: bool = False,
        limit: int | Callable[..., int] = 1,
        metrics_name: str | None = None,
    ):
        for key in keys:
            if not (isinstance(key, str) or callable(key)):
                raise InvalidArgument(f"a lock key must be a template string or a callable, got {key!r}")
            if isinstance(key, str):
                if not key:
                    raise InvalidArgument("a lock key template must not be empty")
                if is_template(key):
                    placeholders(key)
        if on_busy is not None and not (on_busy in (RAISE, SKIP, RETRY) or callable(on_busy) or _is_status(on_busy)):
            raise InvalidArgument(
                f"on_busy must be 'raise', 'skip', 'retry' (Celery tasks), an HTTP status code or a callable, "
                f"got {on_busy!r}"
            )
        if on_lost not in ON_LOST:
            raise InvalidArgument(f"on_lost must be one of {ON_LOST}, got {on_lost!r}")
        if on_error is not None and not (on_error == RAISE or callable(on_error) or _is_status(on_error)):
            raise InvalidArgument(
                f"on_error must be 'raise', an HTTP status code (e.g. 503) or a callable (request, error), "
                f"got {on_error!r}"
            )
        self.keys = keys
        self.wait = wait
        self.lease = lease
        self.using = using
        self.on_busy = on_busy
        self.on_lost = on_lost
        self.on_error = on_error
        self.reentrant = reentrant
        self.holder = dict(holder or {})
        self.quote = bool(quote)
        self.metrics_name = metrics_name
        if not callable(limit):
            if isinstance(limit, bool) or not isinstance(limit, int):
                raise InvalidArgument(f"limit must be an int or a callable, got {limit!r}")
            if limit > 1 and len(keys) > 1:
                raise InvalidArgument(f"limit={limit} applies to one key; got {len(keys)} keys")
        self.limit = limit

    # -- what the current context holds -----------------------------------------
    @staticmethod
    def current(key: str | None = None) -> Handle | None:
        """The innermost lease this thread or task holds through dynamo_lock (or the one for ``key``).

        Only its own: a task started inside a locked block, or a function run in another
        thread with a copy of the context (``sync_to_async``), inherits the entries but
        does not hold those leases.
        """
        me = _who()
        for entry in reversed(_held.get()):
            if entry.owner is me and (key is None or key in entry.keys):
                return entry.handle
        return None

    def _reentered(self, keys: list[str]) -> Handle | None:
        if not self.reentrant:
            return None
        me = _who()
        held = [e for e in _held.get() if e.alias == self.using and e.owner is me and e.handle.is_held]
        if all(any(k in e.keys for e in held) for k in keys):
            return next(e.handle for e in reversed(held) if keys[0] in e.keys)
        return None

    # -- acquiring and releasing --------------------------------------------------
    def _client(self) -> LockClient:
        return get_lock_client(self.using)

    def _name(self, specs: Sequence[KeySpec]) -> str | None:
        """The metrics name: ``metrics_name=``, else the templates as written (not as
        filled: one series per template), else None (the engine takes the key's prefix)."""
        if self.metrics_name is not None:
            return self.metrics_name
        if specs and all(isinstance(spec, str) for spec in specs):
            return ",".join(cast("Sequence[str]", specs))
        return None

    def _acquire(self, keys: list[str], holder: Mapping[str, Any], name: str | None, limit: int = 1) -> Handle:
        client = self._client()
        if len(keys) == 1:
            return client.acquire(
                keys[0], wait=self.wait, lease=self.lease, holder=holder, limit=limit, metrics_name=name
            )
        _one_key(keys, limit)
        return client.acquire_many(keys, wait=self.wait, lease=self.lease, holder=holder, metrics_name=name)

    async def _acquire_async(
        self, keys: list[str], holder: Mapping[str, Any], name: str | None, limit: int = 1
    ) -> Handle:
        """Waits without holding a thread, for one key or several."""
        client = self._client()
        if len(keys) == 1:
            return await client.acquire_async(
                keys[0], wait=self.wait, lease=self.lease, holder=holder, limit=limit, metrics_name=name
            )
        _one_key(keys, limit)
        return await client.acquire_many_async(keys, wait=self.wait, lease=self.lease, holder=holder, metrics_name=name)

    def _limit_of(self, signature: inspect.Signature | None, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
        """This call's limit: the callable's answer, given the call's arguments by name."""
        if not callable(self.limit):
            return check_limit(self.limit)
        return check_limit(call_with_arguments(self.limit, signature, args, kwargs))

    async def _finish_async(self, handle: Handle, error: BaseException | None) -> None:
        """``_finish`` on the client's holders' pool: a release never queues behind waiters."""
        await self._client().run_for_holder(self._finish, handle, error)

    def _busy(
        self, error: LockNotAcquired, request: HttpRequest | None, func: Callable[..., Any], args: Sequence[Any] = ()
    ) -> Any:
        policy = self.on_busy
        if policy is None:
            policy = 423 if request is not None else RAISE
        if policy == RAISE:
            raise error
        if policy == SKIP:
            return None
        if policy == RETRY:
            from .celery import retry_busy_task  # only a Celery task can be retried

            return retry_busy_task(args, error)
        where = _where(func)
        answer = "on_busy handles it" if callable(policy) else f"answered {policy}"
        # INFO, not WARNING: a busy lock is the lock doing its job; how often is worth
        # seeing when tuning, not an alarm (docs/logging.md).
        _log_answer(logging.INFO, ("busy", where), "%s: its lock is busy, %s", where, answer, error)
        if callable(policy):
            return _mark_logged(policy(request, error))
        return _mark_logged(busy_response(error, status=int(policy)))

    def _trouble(self, error: BackendError, request: HttpRequest | None, func: Callable[..., Any]) -> Any:
        """DynamoDB could not be asked for the lock. A passing trouble (``retryable``)
        goes to ``on_error``; one no wait can fix (a missing table, denied access, bad
        credentials) is a deployment bug and raises, so Django reports it as a 500."""
        policy = self.on_error
        if policy is None:
            policy = 503 if request is not None else RAISE
        if policy == RAISE or not error.retryable:
            raise error
        where = _where(func)
        answer = "on_error handles it" if callable(policy) else f"answered {policy}"
        # Counted by cause: a throttled table and an unreachable endpoint are different news.
        kind = ("trouble", where, error.code or type(error.__cause__ or error).__name__)
        _log_answer(logging.WARNING, kind, "%s: could not acquire its lock, %s", where, answer, error)
        if callable(policy):
            return _mark_logged(policy(request, error))
        return _mark_logged(error_response(error, status=int(policy)))

    def _finish(self, handle: Handle, error: BaseException | None) -> None:
        """Release; report a lease that ended during the call, never hiding ``error``.

        ``release()`` raises LockLost whenever the lease ended first, expired during
        the call included (the engine then sends ``lock_lost`` itself).
        """
        if error is not None:
            release_quietly_if_failing(handle, error)
            return
        try:
            handle.release()
        except LockLost as exc:
            self._lost(handle, exc)

    def _lost(self, handle: Handle, exc: LockLost) -> None:
        logger.warning("lease lost while the protected code ran: %s", exc)
        if self.on_lost == "raise":
            raise exc

    # -- decorator ------------------------------------------------------------------
    def __call__(self, func: F) -> F:
        if not callable(func):
            # `@dynamo_lock` without parentheses made the function the key and now the
            # first argument of a call (e.g. the request) arrives here.
            raise InvalidArgument(
                f"dynamo_lock must be called to make a decorator: write @dynamo_lock() or "
                f'@dynamo_lock("name:{{arg}}"), not @dynamo_lock (got {type(func).__name__})'
            )
        if inspect.isgeneratorfunction(func) or inspect.isasyncgenfunction(func):
            # Calling one only creates the generator: the lock would be released before
            # its body ran.
            raise InvalidArgument(
                f"dynamo_lock cannot decorate the generator function {func.__qualname__}: its body runs after "
                f"the call returns, unlocked. Lock inside it instead: with dynamo_lock(...): yield ..."
            )
        keys = self.keys or (f"{func.__module__}.{func.__qualname__}",)
        signature = check_templates(keys, func)
        name = self._name(keys)
        if callable(self.limit):
            check_arguments(self.limit, func, "limit")
        elif not 1 <= self.limit <= MAX_LIMIT:
            # As a model field's bad option: reported by the system check (dynlock.E017)
            # with every other one, and refused by each call.
            keytemplates.declared_limits.append((_where(func), self.limit))

        if iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                resolved = resolve_keys(keys, signature, args, kwargs, self.quote)
                if self._reentered(resolved) is not None:
                    return await func(*args, **kwargs)
                request = _find_request(args)
                holder = _holder(func, request, self.holder, args)
                try:
                    handle = await self._acquire_async(resolved, holder, name, self._limit_of(signature, args, kwargs))
                except LockNotAcquired as error:
                    return self._busy(error, request, func, args)
                except BackendError as error:
                    return self._trouble(error, request, func)
                token = _held.set(_held.get() + (_Held(self.using, tuple(resolved), handle, _who()),))
                failure: BaseException | None = None
                try:
                    return await func(*args, **kwargs)
                except BaseException as exc:  # includes CancelledError: release all the same
                    failure = exc
                    raise
                finally:
                    _held.reset(token)
                    await self._finish_async(handle, failure)

            return cast(F, async_wrapper)

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            resolved = resolve_keys(keys, signature, args, kwargs, self.quote)
            if self._reentered(resolved) is not None:
                return func(*args, **kwargs)
            request = _find_request(args)
            try:
                limit = self._limit_of(signature, args, kwargs)
                handle = self._acquire(resolved, _holder(func, request, self.holder, args), name, limit)
            except LockNotAcquired as error:
                return self._busy(error, request, func, args)
            except BackendError as error:
                return self._trouble(error, request, func)
            token = _held.set(_held.get() + (_Held(self.using, tuple(resolved), handle, _who()),))
            failure: BaseException | None = None
            try:
                return func(*args, **kwargs)
            except BaseException as exc:
                failure = exc
                raise
            finally:
                _held.reset(token)
                self._finish(handle, failure)

        return cast(F, wrapper)

    # -- context manager ------------------------------------------------------------
    def _static_keys(self) -> list[str]:
        if self.on_busy not in (None, RAISE):
            raise InvalidArgument(
                "in a with block a busy lock raises LockNotAcquired: on_busy applies to decorated functions only"
            )
        if self.on_error not in (None, RAISE):
            raise InvalidArgument(
                "in a with block DynamoDB's errors raise BackendError: on_error applies to decorated functions only"
            )
        if not self.keys:
            raise InvalidArgument('dynamo_lock used as a context manager needs a key: with dynamo_lock("export"): ...')
        if callable(self.limit):
            raise InvalidArgument(
                "a limit callable is given a decorated function's arguments; in a with block pass the limit: limit=5"
            )
        if self.quote:
            raise InvalidArgument(
                "quote=True applies to the key templates of decorated functions; in a with block "
                "the key is used as written: quote the values yourself (urllib.parse.quote)"
            )
        keys = []
        for key in self.keys:
            # A plain key is used as written ("export:{", "a{{b"); a placeholder here
            # would never be filled, so it is a mistake, not a key.
            if not isinstance(key, str) or is_template(key):
                raise InvalidArgument(
                    f"dynamo_lock used as a context manager takes plain keys, not templates or callables: "
                    f'got {key!r}; format it yourself, e.g. dynamo_lock(f"order:{{order.pk}}")'
                )
            keys.append(key)
        return keys

    def __enter__(self) -> Handle:
        keys = self._static_keys()
        handle = self._reentered(keys) if self.reentrant else None
        entered = handle is None
        if handle is None:
            handle = self._acquire(keys, _holder(None, None, self.holder), self._name(keys), cast(int, self.limit))
        _push_context(self, _Held(self.using, tuple(keys), handle, _who()), entered)
        return handle

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        entry, entered, token = _pop_context(self)
        _held.reset(token)
        if entered:
            self._finish(entry.handle, exc)

    async def __aenter__(self) -> Handle:
        keys = self._static_keys()
        handle = self._reentered(keys) if self.reentrant else None
        entered = handle is None
        if handle is None:
            holder = _holder(None, None, self.holder)
            handle = await self._acquire_async(keys, holder, self._name(keys), cast(int, self.limit))
        _push_context(self, _Held(self.using, tuple(keys), handle, _who()), entered)
        return handle

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        entry, entered, token = _pop_context(self)
        _held.reset(token)
        if entered:
            await self._finish_async(entry.handle, exc)


# A `with` block's state lives in a context variable, not on the dynamo_lock object,
# so one object shared by threads or tasks stays correct.
_entered: contextvars.ContextVar[tuple[tuple[int, _Held, bool, contextvars.Token[tuple[_Held, ...]]], ...]] = (
    contextvars.ContextVar("dynlock_entered", default=())
)


def _push_context(lock: dynamo_lock, entry: _Held, entered: bool) -> None:
    token = _held.set(_held.get() + (entry,))
    _entered.set(_entered.get() + ((id(lock), entry, entered, token),))


def _pop_context(lock: dynamo_lock) -> tuple[_Held, bool, contextvars.Token[tuple[_Held, ...]]]:
    stack = _entered.get()
    for index in range(len(stack) - 1, -1, -1):
        if stack[index][0] == id(lock):
            _, entry, entered, token = stack[index]
            _entered.set(stack[:index] + stack[index + 1 :])
            return entry, entered, token
    raise RuntimeError("dynamo_lock.__exit__ without a matching __enter__ in this context")


def _one_key(keys: list[str], limit: int) -> None:
    if limit > 1:
        raise InvalidArgument(f"limit={limit} applies to one key; this call's keys are {keys}")


def _is_status(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 400 <= value <= 599
