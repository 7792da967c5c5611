"""One lock client per alias per process, built lazily from the settings, and rebuilt
when the setting changes (a test's ``override_settings`` or ``settings`` fixture)."""

from __future__ import annotations

import threading
from typing import Any

from django.core.signals import setting_changed

from .conf import DEFAULT_ALIAS, clear_caches, get_options
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


def _on_setting_changed(*, setting: str, **kwargs: Any) -> None:
    if setting == "DYNLOCK":
        clear_caches()
        forget_clients()


# Here rather than in conf.py, which the registry imports: conf.py imports nothing that
# imports it back (docs/architecture.md, "Imports"). Importing django_dynlock imports this
# module, so the receiver is connected before any alias is read. Connected by a call
# rather than with @receiver: Django ships no type hints, and its decorator would leave
# the function untyped.
setting_changed.connect(_on_setting_changed, dispatch_uid="django_dynlock.registry.setting_changed")
