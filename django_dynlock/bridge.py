"""Turns the engine's listener events into Django signals.

The engine knows nothing of Django; each client built by ``get_lock_client`` gets
this listener.
"""

from __future__ import annotations

import threading
from typing import Any

from django.db import connections

from . import signals
from .engine.client import LockClient
from .engine.heartbeat import THREAD_NAME_PREFIX

SIGNALS = {
    "acquired": signals.lock_acquired,
    "released": signals.lock_released,
    "busy": signals.lock_busy,
    "at_risk": signals.lock_at_risk,
    "lost": signals.lock_lost,
    "broken": signals.lock_broken,
}


def send_signal(event: str, *, client: LockClient, **info: Any) -> None:
    signal = SIGNALS.get(event)
    if signal is None or not signal.receivers:
        return
    signal.send(sender=LockClient, client=client, alias=client.options.alias, **info)
    if threading.current_thread().name.startswith(THREAD_NAME_PREFIX):
        # Receivers may have used the ORM from our background thread; nothing else
        # would ever close those connections.
        connections.close_all()
