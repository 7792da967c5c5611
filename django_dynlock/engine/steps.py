"""The acquisitions' steps, and the drivers that run them.

An acquisition (one key in acquiring.py, several in multikey.py), its in-process gate
and its undo included, does no I/O and no waiting itself, as h11 and h2 keep a protocol
apart from its sockets: it is a generator that yields ``Enter`` (take this key's
in-process gate), ``Send`` (make this request), ``Sleep`` (wait this long), ``Prepare``
(what a coroutine does on a thread first) or ``OnCancel`` (what a cancelled coroutine
must mark), gets each reply back (or has the
failure thrown in at the ``yield``), and returns its lease when done. A driver does the
rest, and only the drivers differ by colour, as psycopg 3 keeps its generators apart
from its two waiting functions: ``run`` on the calling thread with ``time.sleep``
and a blocking gate (the schedule explorer patches that clock to run it in simulated
time), ``run_async`` with ``asyncio.sleep``, ``KeyLocks.enter_async`` and one hop to a
thread per request, on the client's executors. The decisions are the same for both.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, TypeVar

from .clock import monotonic
from .executors import Executors
from .keylocks import KeyLocks

T = TypeVar("T")


@dataclass(frozen=True)
class Send:
    """Make one request: ``call`` sends it (through the Store) and returns its reply.

    ``holding``: an undo, which a coroutine runs on the holders' pool (waiters never
    fill it) and sees through even if it is cancelled meanwhile."""

    call: Callable[[], Any]
    holding: bool = False


@dataclass(frozen=True)
class Enter:
    """Take the in-process gate of ``key`` (keylocks.py), waiting until monotonic
    ``until`` at most; the reply says whether it was taken."""

    key: str
    until: float


@dataclass(frozen=True)
class Prepare:
    """What a coroutine runs on a pool thread before its first request, and a thread
    leaves to that request: building the boto3 client, which reads files."""

    call: Callable[[], Any]


@dataclass(frozen=True)
class OnCancel:
    """What to call when a coroutine is cancelled with a request in flight (it may land:
    the undo must know). A thread is never cancelled: ``run`` only goes on."""

    call: Callable[[], None]


@dataclass(frozen=True)
class Sleep:
    """Wait this many seconds before the next step; sooner once ``wake`` is set (an
    election's cancel from another thread): a thread at once, a coroutine within a second."""

    seconds: float
    wake: threading.Event | None = None


# A coroutine's sleep with a ``wake`` event looks at it this often: an event set from
# another thread cannot wake an asyncio.sleep.
WAKE_NAP = 1.0


Step = Send | Sleep | Enter | Prepare | OnCancel
Steps = Generator[Step, Any, T]


def _nothing() -> None:
    pass


def perform(step: Step, gate: KeyLocks) -> Any:
    """One step on this thread, as ``run`` does it: the reply to send back into the steps.
    (The schedule explorer's election world performs each step but a sleep this way.)"""
    if isinstance(step, Sleep):
        if step.wake is not None:
            step.wake.wait(step.seconds)
        else:
            time.sleep(step.seconds)
    elif isinstance(step, Enter):
        return gate.enter(step.key, max(0.0, step.until - monotonic()))
    elif isinstance(step, Send):
        return step.call()
    return None


def run(steps: Steps[T], gate: KeyLocks) -> T:
    """Drive ``steps`` on this thread: requests inline, sleeps with ``time.sleep``, the
    gate waited on with this thread. What any of them raises (a KeyboardInterrupt, a
    task's time limit) is thrown in, so that the steps undo what they must."""
    reply: Any = None
    failure: BaseException | None = None
    while True:
        try:
            step = steps.send(reply) if failure is None else steps.throw(failure)
        except StopIteration as done:
            result: T = done.value
            return result
        reply, failure = None, None
        try:
            reply = perform(step, gate)
        except BaseException as exc:  # handed to the steps, which re-raise what they do not handle
            failure = exc


async def run_async(steps: Steps[T], executors: Executors, gate: KeyLocks) -> T:
    """Drive ``steps`` from a coroutine: no thread is held while it waits.

    Each request runs on the client's bounded waiters' pool (never the loop's default:
    a thread per waiter would starve the application's own ``to_thread`` work), an
    undo on its holders' pool. A cancellation that arrives while a request is in flight
    calls the steps' ``OnCancel`` (the request may land), lets the request finish in
    its thread, and is thrown into the steps, whose undo then runs shielded; a second
    cancellation leaves that undo to its thread, and propagates.
    """
    loop = asyncio.get_running_loop()
    reply: Any = None
    failure: BaseException | None = None
    on_cancel: Callable[[], None] = _nothing
    cancelled = False
    try:
        while True:
            try:
                step = steps.send(reply) if failure is None else steps.throw(failure)
            except StopIteration as done:
                result: T = done.value
                return result
            reply, failure = None, None
            if isinstance(step, OnCancel):
                on_cancel = step.call
                continue
            try:
                if isinstance(step, Sleep):
                    await _sleep(step)
                elif isinstance(step, Enter):
                    reply = await gate.enter_async(step.key, step.until)
                elif isinstance(step, Prepare):
                    await loop.run_in_executor(executors.waiting, step.call)
                else:
                    pool = executors.holding if step.holding else executors.waiting
                    future = loop.run_in_executor(pool, step.call)
                    try:
                        reply = await asyncio.shield(future)
                    except asyncio.CancelledError:
                        if not step.holding:
                            on_cancel()
                            with contextlib.suppress(BaseException):
                                await future  # the undo must come after it, not race it
                        raise
            except asyncio.CancelledError as cancel:
                if cancelled:
                    raise  # cancelled again while undoing: the undo goes on in its thread
                cancelled = True
                failure = cancel
            except Exception as exc:
                failure = exc
    finally:
        steps.close()


async def _sleep(step: Sleep) -> None:
    if step.wake is None:
        await asyncio.sleep(step.seconds)
        return
    until = monotonic() + step.seconds
    while not step.wake.is_set() and (left := until - monotonic()) > 0:
        await asyncio.sleep(min(left, WAKE_NAP))
