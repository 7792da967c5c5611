"""Which clock a write is stamped by: DynamoDB's as this client can bound it, read once
before a first write; this host's only before any reply; none when replies carry no Date.

Every write that stores an expiry (acquire, renew, adopt) asks the ``Stamper`` the time to
store, whether to store one at all (``watch_only``), the base of a new fencing counter,
and until when its holder may trust the lease. One per client and process: a forked
child reads the clock afresh.
"""

from __future__ import annotations

import logging
import threading
import time

from botocore.exceptions import ClientError

from ..exceptions import DynLockError
from . import requests as rq
from .clock import DRIFT, ServerClock, monotonic
from .failures import safe_endpoint
from .options import ClientOptions
from .store import Store

logger = logging.getLogger("django_dynlock")


class Stamper:
    """The stamps of one client's writes in one process (see the module's docstring)."""

    def __init__(self, options: ClientOptions, clock: ServerClock, store: Store):
        self.options = options
        self.clock = clock
        self.store = store
        self._lock = threading.Lock()
        self._clock_read = False  # whether learn_clock has asked in this process

    def learn_clock(self, stored: str) -> None:
        """Before a client's first write: one read, whose reply's Date tells DynamoDB's clock.

        So that the first write, like every later one, takes its expiry and the base of a
        new fencing counter from DynamoDB's clock, not this host's (a clock a minute slow
        stored an expiry a taker trusted, and started a counter below tokens already
        issued). Half a read unit, once per client and process. The acquire loops
        (acquire's and acquire_many's) ask ``clock_unread`` and send ``read_clock`` as
        one of their steps, so that their async forms read too; adopt calls this.
        """
        if self.clock_unread():
            self.read_clock(stored)

    def clock_unread(self) -> bool:
        """Whether a first write must read the clock first; true once per client and process."""
        with self._lock:
            if self.clock.replies or self._clock_read:
                return False
            self._clock_read = True
            return True

    def read_clock(self, stored: str) -> None:
        """The read of ``learn_clock``. Best effort: if it fails, the write goes without
        (see requests.acquire, and _restamp in acquiring.py)."""
        try:
            self.store.call(
                "get_item",
                "learn DynamoDB's clock",
                attempts=1,
                Key=rq.key(self.options, stored),
                ProjectionExpression="#k",
                ExpressionAttributeNames={"#k": self.options.key_attribute},
            )
        except (DynLockError, ClientError) as exc:
            logger.debug("could not read DynamoDB's clock before a first write: %s", exc)

    def watch_only(self) -> bool:
        """Whether writes store no expiry: DynamoDB's replies carry no Date, so nothing tells its
        clock, and this host's wall clock must not decide when a taker may take a lease."""
        if not self.clock.dateless:
            return False
        self.store.say_once(
            "no-date",
            "replies of DynamoDB server at %s carry no Date header: lock expiries are not stored, "
            "and a dead holder's key is taken over only by a waiter that watches it unchanged for a whole lease",
            safe_endpoint(self.options.endpoint_url),
        )
        return True

    def fence_base(self, stamp: float) -> float | None:
        """The base of a new fencing counter: the stamp when it is DynamoDB's clock; None while
        that clock is unknown (the write then continues an existing counter only). A server
        without Date headers leaves only this host's wall clock (docs/protocol.md, known limits)."""
        return stamp if self.clock.known or self.clock.dateless else None

    def stamp(self, at: float) -> float:
        """The time a write sent at monotonic ``at`` stamps into the item.

        The latest DynamoDB's clock can read then, so that no stored expiry comes
        earlier than its holder expects; this host's wall clock only for a client's
        very first request, before any reply (see _restamp).
        """
        latest = self.clock.latest(at)
        return latest if latest is not None else time.time()

    def holder_end(self, sent: float, lease_seconds: float, expires: float) -> float:
        """Until when (monotonic) a write sent at ``sent`` that stored ``expires`` may be trusted, before the margin.

        Never past a lease after the send, and never past the moment DynamoDB's clock
        could reach the stored expiry, which is when takers may take the key.
        """
        end = sent + lease_seconds
        now = monotonic()
        latest = self.clock.latest(now)
        if latest is not None:
            end = min(end, now + (expires - latest) / (1.0 + DRIFT))
        return end
