"""Observers: where metrics and traces (``django_dynlock.contrib``) hear of the engine.

The engine imports no metrics or tracing library. An observer (``contrib.prometheus``,
``contrib.opentelemetry``) is added to ``OBSERVERS`` when its app is installed; the
engine asks ``if OBSERVERS:`` before it builds anything for them, so with none added an
acquire pays one truth test of a list per hook (docs/benchmarks.md, "Observability").

Every measure is labelled by ``name``, never by the key: the key template, a
``metrics_name=`` given to the call, or else the key's prefix up to its first ``:``
(``other`` without one). Ten thousand tenants through ``"export:{tenant_id}"`` make one
series, not ten thousand.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

__all__ = [
    "OBSERVERS",
    "AcquireObservation",
    "Observer",
    "ReleaseObservation",
    "add_observer",
    "metrics_name",
    "operation_name",
    "remove_observer",
]

#: The observers told of every client's events, requests and acquires (usually empty).
OBSERVERS: list[Observer] = []
_lock = threading.Lock()

OTHER = "other"

logger = logging.getLogger("django_dynlock")


def metrics_name(key: str, given: str | None = None) -> str:
    """The ``name`` label of ``key``: ``given`` (a template, or ``metrics_name=``), else
    the key's prefix up to its first ``:``, else ``other``. Never the key itself."""
    if given:
        return given
    prefix, colon, _ = key.partition(":")
    return prefix if colon and prefix else OTHER


_OPERATIONS: dict[str, str] = {}


def operation_name(operation: str) -> str:
    """DynamoDB's name of a boto3 method: ``update_item`` -> ``UpdateItem``."""
    name = _OPERATIONS.get(operation)
    if name is None:
        name = _OPERATIONS[operation] = "".join(part.capitalize() for part in operation.split("_"))
    return name


class AcquireObservation:
    """One acquire call, as an observer follows it (a span, say). Methods do nothing here."""

    #: Looks at the key so far (writes and reads), kept up to date by the acquire loop.
    looks = 0

    def busy_look(self, looks: int, holder: str | None) -> None:
        """A look (a write or a read) found the key held by someone else."""

    def end(self, outcome: str, *, waited: float, looks: int, token: int | None, error: BaseException | None) -> None:
        """The call ended: ``outcome`` is acquired, busy or error."""


class ReleaseObservation:
    """One release call, as an observer follows it."""

    def end(self, outcome: str, *, held: float, error: BaseException | None) -> None:
        """The release ended: ``outcome`` is released, lost (LockLost) or error."""


class Observer:
    """What an observer may hear; each method does nothing unless overridden.

    Called on the thread that saw it (the caller's, a pool thread, the heartbeat thread):
    keep it short, and never raise (what raises is logged and skipped by the engine).
    """

    def event(self, event: str, *, alias: str, name: str, info: Mapping[str, Any]) -> None:
        """A listener event (``LockClient.add_listener``): acquired, released, busy, at_risk,
        lost, ...; and one only observers hear: ``acquire_failed`` (an acquire call ended in
        an error, not busy: ``key``, ``waited``, ``error``)."""

    def request(self, *, alias: str, op: str, outcome: str, seconds: float) -> None:
        """One HTTP request to DynamoDB: ``op`` as DynamoDB names it, ``outcome`` one of
        ok, condition_failed, throttled, error."""

    def renewed(self, *, alias: str, name: str, headroom: float) -> None:
        """A renewal landed with ``headroom`` seconds of the lease's validity left."""

    def acquiring(self, *, alias: str, name: str, key: str) -> AcquireObservation | None:
        """An acquire call starts (on the caller's thread or task: a span's parent is current)."""
        return None

    def releasing(self, *, alias: str, name: str, key: str) -> ReleaseObservation | None:
        """A holder's ``release()`` starts (on its thread)."""
        return None


def add_observer(observer: Observer) -> None:
    """Tell ``observer`` of every client's events from now on (once, however often added)."""
    with _lock:
        if observer not in OBSERVERS:
            OBSERVERS.append(observer)


def remove_observer(observer: Observer) -> None:
    with _lock:
        if observer in OBSERVERS:
            OBSERVERS.remove(observer)


# What the engine calls (only after ``if OBSERVERS:``). An observer that raises is logged
# and skipped: metrics never break a lock.


def observer_failed(observer: object, what: str) -> None:
    """Log an observer that raised (with its traceback) and go on: metrics never break a lock."""
    logger.exception("dynlock observer %r failed on %s", observer, what)


def tell_event(event: str, alias: str, name: str, info: Mapping[str, Any]) -> None:
    for observer in OBSERVERS:
        try:
            observer.event(event, alias=alias, name=name, info=info)
        except Exception:
            observer_failed(observer, event)


def tell_failed(alias: str, key: str, given: str | None, waited: float, error: BaseException) -> None:
    """An acquire call DynamoDB failed (not busy): the observers' ``acquire_failed`` event."""
    tell_event("acquire_failed", alias, metrics_name(key, given), {"key": key, "waited": waited, "error": error})


def tell_request(alias: str, op: str, outcome: str, seconds: float) -> None:
    for observer in OBSERVERS:
        try:
            observer.request(alias=alias, op=op, outcome=outcome, seconds=seconds)
        except Exception:
            observer_failed(observer, op)


def tell_renewed(alias: str, name: str, headroom: float) -> None:
    for observer in OBSERVERS:
        try:
            observer.renewed(alias=alias, name=name, headroom=headroom)
        except Exception:
            observer_failed(observer, "renewal")


class _Acquires(AcquireObservation):
    """The observations of one acquire call, one per observer that follows it."""

    def __init__(self, parts: list[AcquireObservation]):
        self.parts = parts
        self.looks = 0
        self.ended = False

    def busy_look(self, looks: int, holder: str | None) -> None:
        for part in self.parts:
            try:
                part.busy_look(looks, holder)
            except Exception:
                observer_failed(part, "busy look")

    def end(self, outcome: str, *, waited: float, looks: int, token: int | None, error: BaseException | None) -> None:
        if self.ended:
            return
        self.ended = True
        for part in self.parts:
            try:
                part.end(outcome, waited=waited, looks=looks, token=token, error=error)
            except Exception:
                observer_failed(part, "acquire end")


def start_acquire(alias: str, name: str, key: str) -> AcquireObservation | None:
    parts: list[AcquireObservation] = []
    for observer in OBSERVERS:
        try:
            part = observer.acquiring(alias=alias, name=name, key=key)
        except Exception:
            observer_failed(observer, "acquire start")
            continue
        if part is not None:
            parts.append(part)
    return _Acquires(parts) if parts else None


class _Releases(ReleaseObservation):
    def __init__(self, parts: list[ReleaseObservation]):
        self.parts = parts

    def end(self, outcome: str, *, held: float, error: BaseException | None) -> None:
        for part in self.parts:
            try:
                part.end(outcome, held=held, error=error)
            except Exception:
                observer_failed(part, "release end")


def start_release(alias: str, name: str, key: str) -> ReleaseObservation | None:
    parts: list[ReleaseObservation] = []
    for observer in OBSERVERS:
        try:
            part = observer.releasing(alias=alias, name=name, key=key)
        except Exception:
            observer_failed(observer, "release start")
            continue
        if part is not None:
            parts.append(part)
    return _Releases(parts) if parts else None
