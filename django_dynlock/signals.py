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
from .engine.election import election_of
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

#: This process was elected leader (``client.election(name).campaign()`` returned, or
#: is about to). Also: ``election`` (its name), ``term`` (the Lease), ``token``
#: (greater than every earlier term's), ``holder`` (dict). ``key`` is ``"election:" + name``.
leader_elected = Signal()

#: This process' term ended before it resigned: it is no longer leader, and must stop
#: acting as one. Also: ``election``, ``term``, ``token``, ``holder``, ``reason`` (as for
#: ``lock_lost``). Sent at the term's local validity end at the latest, before another
#: contender may be elected, by the heartbeat thread, like ``lock_lost``. Not sent on a
#: resignation (``term.release()``): ``lock_released`` is.
leadership_lost = Signal()


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


# The events about an election's term (its lease carries the election's name) also send these.
_ELECTION_SIGNALS = {"acquired": leader_elected, "lost": leadership_lost}


def send_signal(event: str, *, client: LockClient, **info: Any) -> None:
    """The engine listener: send the signal of ``event``, if anyone listens."""
    sent = False
    signal = _SIGNALS.get(event)
    if signal is not None and signal.receivers:
        signal.send(sender=LockClient, client=client, alias=client.options.alias, **info)
        sent = True
    leader_signal = _ELECTION_SIGNALS.get(event)
    lease = info.get("lease")
    if leader_signal is not None and leader_signal.receivers and lease is not None:
        name = election_of(lease)
        if name is not None:
            extra = {"reason": info["reason"]} if "reason" in info else {}
            leader_signal.send(
                sender=LockClient,
                client=client,
                alias=client.options.alias,
                key=lease.key,
                election=name,
                term=lease,
                token=lease.token,
                holder=lease.holder,
                **extra,
            )
            sent = True
    if not sent:
        return
    if threading.current_thread().name.startswith(THREAD_NAME_PREFIX):
        # Receivers may have used the ORM from our background thread; nothing else
        # would ever close those connections.
        connections.close_all()
