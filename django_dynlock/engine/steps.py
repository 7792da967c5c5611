"""The acquire loop's steps, and the drivers that run them.

The loop that acquires one key (acquiring.py) does no I/O and no waiting itself, as
h11 and h2 keep a protocol apart from its sockets: it is a generator that yields
``Send`` (make this request) or ``Sleep`` (wait this long), gets each request's reply
back (or has the request's exception thrown in at the ``yield``), and returns its lease
when done. A driver does the rest: ``run`` on the calling thread with ``time.sleep``
(the schedule explorer patches that clock to run it in simulated time), ``run_async``
with ``asyncio.sleep`` between looks and one hop to a thread per request, on an
executor the caller hands in. The decisions are the same for both.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Send:
    """Make one request: ``call`` sends it (through the Store) and returns its reply."""

    call: Callable[[], Any]


@dataclass(frozen=True)
class Sleep:
    """Wait this many seconds before the next step."""

    seconds: float


Step = Send | Sleep
Steps = Generator[Step, Any, T]


def run(steps: Steps[T]) -> T:
    """Drive ``steps`` on this thread: requests inline, sleeps with ``time.sleep``."""
    reply: Any = None
    failure: BaseException | None = None
    while True:
        try:
            step = steps.send(reply) if failure is None else steps.throw(failure)
        except StopIteration as done:
            result: T = done.value
            return result
        reply, failure = None, None
        if isinstance(step, Sleep):
            time.sleep(step.seconds)
            continue
        try:
            reply = step.call()
        except BaseException as exc:  # handed to the loop, which re-raises what it does not handle
            failure = exc


async def run_async(
    steps: Steps[T],
    executor: concurrent.futures.Executor,
    *,
    interrupted: Callable[[], None] = lambda: None,
) -> T:
    """Drive ``steps`` from a coroutine: no thread is held while it waits.

    Each request runs on ``executor`` (a bounded one of the caller's, never the loop's
    default: a thread per waiter would starve the application's own ``to_thread``
    work). A cancellation that arrives while a request is in flight calls
    ``interrupted`` (the request may land: the caller's undo must know), lets the
    request finish in its thread, and then propagates.
    """
    loop = asyncio.get_running_loop()
    reply: Any = None
    failure: BaseException | None = None
    try:
        while True:
            try:
                step = steps.send(reply) if failure is None else steps.throw(failure)
            except StopIteration as done:
                result: T = done.value
                return result
            reply, failure = None, None
            if isinstance(step, Sleep):
                await asyncio.sleep(step.seconds)
                continue
            future = loop.run_in_executor(executor, step.call)
            try:
                reply = await asyncio.shield(future)
            except asyncio.CancelledError:
                interrupted()
                try:
                    await future  # the undo must come after it, not race it
                except BaseException:  # noqa: S110 (its outcome no longer matters: we are leaving)
                    pass
                raise
            except Exception as exc:
                failure = exc
    finally:
        steps.close()
