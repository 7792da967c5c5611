"""The client's listeners, and the one way events reach them.

Every part of the client that has something to tell (an acquire, a renewal, a loss, a
break) calls ``emit``; listeners see the client they were added to as ``client=``,
whichever collaborator saw the event.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from . import observe

if TYPE_CHECKING:
    from .lease import Lease

logger = logging.getLogger("django_dynlock")

Listener = Callable[..., None]


class Events:
    """The listeners of one client; ``emit`` calls each, and a failing one does not stop the others."""

    def __init__(self, client: object, listeners: Iterable[Listener] = (), *, alias: str = "default"):
        self.client = client  # what listeners get as client=: the facade, not a collaborator
        self.listeners = list(listeners)
        self.alias = alias  # the metrics' label (observe.py)

    def add(self, listener: Listener) -> None:
        self.listeners.append(listener)

    def emit(self, event: str, lease: Lease | None = None, *, name: str | None = None, **info: Any) -> None:
        """Tell the listeners, then the observers (``name``: the metrics name of an event
        without a lease, which carries its own; never given to listeners)."""
        if lease is not None:
            info = {"lease": lease, "key": lease.key, "token": lease.token, "holder": lease.holder, **info}
        for listener in self.listeners:
            try:
                listener(event, client=self.client, **info)
            except Exception:
                logger.exception("dynlock listener %r failed on %s", listener, event)
        if observe.OBSERVERS:
            if lease is not None:
                name = lease.metrics_name
            observe.tell_event(event, self.alias, name or observe.metrics_name(info.get("key") or ""), info)
