"""Django signals for lock events. ``sender`` is the LockClient class.

Every signal has the keyword arguments ``client`` (the LockClient), ``alias`` and
``key``. Connect with ``@receiver(lock_lost)`` as usual. Signals about a lease that
ends in the background (``lock_lost`` from a failed heartbeat) are sent from the
heartbeat thread; django-dynlock closes that thread's database connections after
sending, so receivers may use the ORM without leaking connections.
"""

from __future__ import annotations

import threading
from typing import Any

from django.db import connections
from django.dispatch import Signal

from .engine.client import LockClient
from .engine.heartbeat import THREAD_NAME_PREFIX

#: A lease was acquired. Also: ``lease``, ``token``, ``holder`` (dict), ``waited`` (seconds).
lock_acquired = Signal()

#: A lease was released by its holder. Also: ``lease``, ``token``, ``holder``, ``held`` (seconds).
lock_released = Signal()

#: An acquire gave up on a busy lock. Also: ``holder`` (a LeaseInfo, or None), ``waited``.
lock_busy = Signal()

#: A renewal failed; the lease is still valid for ``lease.remaining()``.
#: Also: ``lease``, ``token``, ``holder``, ``error``.
lock_at_risk = Signal()

#: A held lease ended before release. Also: ``lease``, ``token``, ``holder``,
#: ``reason`` ("expired", "taken", "broken", "released", "closed", "fork").
lock_lost = Signal()

#: An operator broke a lease. Also: ``token`` (the token given, or None), ``reason``, ``by``.
lock_broken = Signal()


# The engine knows nothing of Django: each client built by ``get_lock_client`` gets
# ``send_signal`` as its listener, which turns the engine's events into the signals above.

_SIGNALS = {
    "acquired": lock_acquired,
    "released": lock_released,
    "busy": lock_busy,
    "at_risk": lock_at_risk,
    "lost": lock_lost,
    "broken": lock_broken,
}


def send_signal(event: str, *, client: LockClient, **info: Any) -> None:
    """The engine listener: send the signal of ``event``, if anyone listens."""
    signal = _SIGNALS.get(event)
    if signal is None or not signal.receivers:
        return
    signal.send(sender=LockClient, client=client, alias=client.options.alias, **info)
    if threading.current_thread().name.startswith(THREAD_NAME_PREFIX):
        # Receivers may have used the ORM from our background thread; nothing else
        # would ever close those connections.
        connections.close_all()
