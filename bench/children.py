"""Child processes of the benchmarks: how they report, how the parent waits for them and stops them.

A child talks to its parent over a ``multiprocessing`` Pipe with tuples whose first
item names the message; a child that fails sends ``("error", traceback)`` instead of
dying silently, and the parent raises ``BenchError`` with it.
"""

from __future__ import annotations

import contextlib
import logging
import traceback
from collections.abc import Iterator
from typing import Any

from bench.contenders import Contender, Spec, make_contender, quiet_peer_logs

CHILD_REPLY_TIMEOUT = 30.0  # seconds the parent waits for any one child message
CHILD_START_TIMEOUT = 90.0  # a child imports boto3 and the libraries: slow on 2 busy cores


class BenchError(RuntimeError):
    """A measurement that cannot go on (a child failed or went silent, a check failed)."""


def quiet_engine_logs() -> None:
    logging.getLogger("django_dynlock").setLevel(logging.ERROR)


def send_error(conn: Any) -> None:
    """In a child: send the exception being handled to the parent, if the pipe still works."""
    try:
        conn.send(("error", traceback.format_exc(limit=6)))
    except Exception:
        pass


def expect(conn: Any, what: str | tuple[str, ...], timeout: float = CHILD_REPLY_TIMEOUT) -> tuple:
    """The child's next message, which must be ``what`` (or one of them); BenchError otherwise."""
    if not conn.poll(timeout):
        raise BenchError(f"no {what!r} from a child within {timeout:.0f}s")
    message = conn.recv()
    if message[0] == "error":
        raise BenchError(f"child failed:\n{message[1]}")
    if message[0] not in ((what,) if isinstance(what, str) else what):
        raise BenchError(f"expected {what!r} from a child, got {message!r}")
    return message


def stop_children(processes: list[Any], conns: list[Any]) -> None:
    """Ask our children to stop, then kill those that do not (by their handles)."""
    for conn in conns:
        try:
            conn.send(("stop",))
        except Exception:
            pass
    for process in processes:
        process.join(15)
    for process in processes:
        if process.is_alive():  # our own child, by its handle; a peer's threads may ignore SIGTERM
            process.kill()
            process.join(5)


def close_quietly(contender: Contender) -> None:
    try:
        contender.close()
    except Exception:
        pass


@contextlib.contextmanager
def child_lane(spec: Spec, endpoint_url: str, conn: Any) -> Iterator[tuple[Contender, Any]]:
    """In a child process: a contender and its first lane. A failure goes to the parent
    as ``("error", traceback)`` instead of killing the child silently."""
    quiet_peer_logs()
    quiet_engine_logs()
    contender = None
    try:
        contender = make_contender(spec, endpoint_url)
        yield contender, contender.lane(0)
    except Exception:
        send_error(conn)
    finally:
        if contender is not None:
            close_quietly(contender)


__all__ = [
    "CHILD_REPLY_TIMEOUT",
    "CHILD_START_TIMEOUT",
    "BenchError",
    "child_lane",
    "close_quietly",
    "expect",
    "quiet_engine_logs",
    "send_error",
    "stop_children",
]
