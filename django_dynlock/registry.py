"""One lock client per alias per process, built lazily from the settings."""

from __future__ import annotations

import threading

from .conf import DEFAULT_ALIAS, get_options
from .engine.client import LockClient
from .signals import send_signal

_clients: dict[str, LockClient] = {}
_lock = threading.Lock()


def get_lock_client(alias: str = DEFAULT_ALIAS) -> LockClient:
    """The process-wide :class:`LockClient` of a ``DYNLOCK`` alias (created on first use)."""
    client = _clients.get(alias)
    if client is None or client.closed:
        with _lock:
            client = _clients.get(alias)
            if client is None or client.closed:
                client = LockClient(get_options(alias), listeners=[send_signal])
                _clients[alias] = client
    return client


def forget_clients() -> None:
    """Drop cached clients (when DYNLOCK changes). Leases already held keep their client."""
    with _lock:
        _clients.clear()
