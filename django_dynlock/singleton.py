"""Run a management command at most once at a time across hosts (cron singletons).

``manage.py runlocked KEY -- COMMAND ...`` and the ``@singleton_command`` decorator
share :func:`run_singleton`: take the lease (or report "busy"), run the body while
the heartbeat renews it, then release it or, with ``at_least``, leave it held for
the rest of that time so the other hosts' runs of the same schedule skip.

Keeping the lease for the rest of ``at_least``: the run stamps the lease's expiry
that far ahead (``Lease.keep_for``) and exits at once. Every later run, on any host,
takes the key as soon as that expiry has passed by DynamoDB's clock.

A lease that ends while the body runs (outage, operator's breaklock) cannot stop
the body: the body can check ``self.dynlock_lease.raise_if_lost()`` before its side
effects. It is reported on stderr afterwards; the body's own outcome (return value,
exception, exit code) is passed on unchanged.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from django.core.management.base import BaseCommand, CommandError
from django.utils.translation import gettext

from .engine.lease import Lease
from .exceptions import DynLockError, LockNotAcquired
from .management import formatting as fmt
from .management.base import lock_client, translated_errors, usage_error

# Django ships no type hints: gettext is typed here, so that what it returns is a str.
_: Callable[[str], str] = gettext

logger = logging.getLogger("django_dynlock.singleton")

T = TypeVar("T")
Handle = Callable[..., Any]


def busy_message(busy: LockNotAcquired, now: dt.datetime) -> str:
    if busy.holder is not None:
        return _("Skipped: lock %(key)r is busy (%(holder)s).") % {
            "key": busy.key,
            "holder": fmt.summary(busy.holder, now),
        }
    return _("Skipped: lock %(key)r is busy.") % {"key": busy.key}


def run_singleton(
    body: Callable[[Lease], T],
    *,
    key: str,
    holder: dict[str, str],
    command: BaseCommand,
    wait: float = 0.0,
    lease: float | None = None,
    at_least: float = 0.0,
    busy_exit: int = 0,
    using: str = "default",
    verbosity: int = 1,
    limit: int = 1,
) -> T | None:
    """Run ``body(lease)`` under the lease on ``key``; ``None`` (or CommandError) when busy.

    ``command`` is the management command whose stdout/stderr/style report what
    happens. Busy: a message on stdout and ``None`` when ``busy_exit`` is 0,
    otherwise ``CommandError(message, returncode=busy_exit)``. ``limit``: how many
    runs may hold ``key`` at once (a semaphore).
    """
    if not 0 <= busy_exit <= 255:
        usage_error(_("busy exit code must be 0-255, got %(code)s") % {"code": busy_exit})
    client = lock_client(using)
    if at_least > 0:
        # So that showlocks can tell a lease kept after its run from a crashed holder's.
        holder = {**holder, fmt.AT_LEAST_KEY: f"{at_least:g}"}
    with translated_errors():
        try:
            held = client.acquire(key, wait=wait, lease=lease, holder=holder, limit=limit)
        except LockNotAcquired as busy:
            message = busy_message(busy, client.server_datetime())
            if busy_exit:
                raise CommandError(message, returncode=busy_exit) from None
            if verbosity >= 1:
                command.stdout.write(message, style_func=command.style.WARNING)
            return None
    started = time.monotonic()
    command.dynlock_lease = held
    try:
        result = body(held)
    except KeyboardInterrupt:
        # Interrupted by hand: free the key now rather than hold it for at_least.
        _finish(held, command, 0.0, started)
        raise
    except BaseException:
        _finish(held, command, at_least, started)
        raise
    _finish(held, command, at_least, started)
    return result


def _finish(held: Lease, command: BaseCommand, at_least: float, started: float) -> None:
    """Release, or keep the lease for what remains of ``at_least``. Never raises."""
    keep = at_least - (time.monotonic() - started)
    try:
        if keep > 0:
            try:
                held.keep_for(keep)
                return
            except DynLockError as exc:
                if not held.is_held:
                    raise
                # Could not restamp the lease: release instead (it is retried and logged).
                logger.warning("could not keep %r for %.1fs, releasing it: %s", held, keep, exc)
        held.release()
    except DynLockError as exc:
        # The body is done; its outcome is what the caller must see. Say that the
        # lock ended early: the body may have overlapped another holder.
        logger.warning("singleton lease ended before the run finished: %s", exc)
        command.stderr.write(
            _("Warning: the lock ended before the run finished: %(error)s") % {"error": exc},
            style_func=command.style.WARNING,
        )


def default_key(command: BaseCommand) -> str:
    """``command:<name>``, the command's name being its module's, as Django resolves it."""
    return f"command:{type(command).__module__.rsplit('.', 1)[-1]}"


def singleton_command(
    key: str | Handle | None = None,
    *,
    wait: float = 0.0,
    lease: float | None = None,
    at_least: float = 0.0,
    busy_exit: int = 0,
    using: str = "default",
) -> Any:
    """Decorate ``BaseCommand.handle`` so that one host at a time runs the command.

    ::

        class Command(BaseCommand):
            @singleton_command(at_least=50)
            def handle(self, *args, **options):
                ...

    ``key`` defaults to ``"command:<command name>"``. The lease is ``self.dynlock_lease``
    while ``handle`` runs. Busy: a message and exit 0, or ``busy_exit``.
    """

    def decorate(handle: Handle) -> Handle:
        @functools.wraps(handle)
        def wrapper(self: BaseCommand, *args: Any, **options: Any) -> Any:
            name = default_key(self)
            return run_singleton(
                lambda _lease: handle(self, *args, **options),
                key=key if isinstance(key, str) else name,
                holder={"command": name.split(":", 1)[1]},
                command=self,
                wait=wait,
                lease=lease,
                at_least=at_least,
                busy_exit=busy_exit,
                using=using,
                verbosity=options.get("verbosity", 1),
            )

        return wrapper

    if callable(key):  # used bare: @singleton_command
        return decorate(key)
    return decorate
