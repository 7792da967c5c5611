"""Handing a lease from one process to another: the enqueuer of a task to its worker.

A lease is owned by its acquisition's owner id (docs/protocol.md), not by a process:
whoever knows the owner id writes as that acquisition. A :class:`Handover` is that
knowledge, small enough for a message header. The giving process stops renewing
(``Lease.hand_over``); the receiving one either continues the lease, renewed by its
own heartbeat (``LockClient.adopt``), or ends it (``LockClient.release_handover``).
Every write is one the holder itself could have made (a renewal, a release), so the
protocol's guarantees hold unchanged; adoption is additionally conditioned on the
sequence number the giver stopped at, so that of two processes handed the same lease
(a message delivered twice) only one holds it.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from botocore.exceptions import ClientError

from ..exceptions import LockLost, LockNotAcquired
from . import items as it
from . import requests as rq
from .clock import ServerClock, monotonic
from .holding import Keeper, released_by
from .keylocks import KeyLocks
from .lease import Handover, Lease, LeaseClient
from .options import ClientOptions
from .stamps import Stamper
from .store import Store

logger = logging.getLogger("django_dynlock")

__all__ = ["Handover", "Handovers"]


class Handovers:
    """``LockClient.adopt`` and ``LockClient.release_handover`` (``Lease.hand_over`` is the Keeper's, holding.py).

    Holds nothing of its own: one per client and process, over that process's store,
    clock and stamper. It calls them, the in-process gate, and the keeper, which holds
    an adopted lease from then on; ``busy_here`` is the client's answer to a key this
    process already holds, the same as an acquire's.
    """

    def __init__(
        self,
        options: ClientOptions,
        *,
        client: LeaseClient,
        store: Store,
        clock: ServerClock,
        stamper: Stamper,
        keeper: Keeper,
        keylocks: KeyLocks,
        busy_here: Callable[[str, str, float], LockNotAcquired],
    ):
        self.options = options
        self.client = client  # what an adopted lease knows as its client: the facade
        self.store = store
        self.clock = clock
        self.stamper = stamper
        self.keeper = keeper
        self.keylocks = keylocks
        self.busy_here = busy_here

    def adopt(self, handover: Handover, lease_seconds: float) -> Lease:
        stored = self.options.prefixed(handover.key)
        if not self.keylocks.enter(stored, 0.0):
            raise self.busy_here(handover.key, stored, monotonic())
        try:
            lease = self._adopt_remote(handover, stored, lease_seconds)
        except BaseException:
            self.keylocks.leave(stored)
            raise
        self.keeper.start(lease, waited=0.0)
        return lease

    def _adopt_remote(self, handover: Handover, stored: str, lease_seconds: float) -> Lease:
        seq = handover.seq + 1
        rvn = uuid.uuid4().hex
        self.stamper.learn_clock(stored)
        clock_was_known = self.clock.known
        sent = monotonic()
        stamp = self.stamper.stamp(sent)
        request = rq.adopt(
            self.options,
            stored,
            owner=handover.owner,
            token=handover.token,
            handed_seq=handover.seq,
            rvn=rvn,
            seq=seq,
            lease_seconds=lease_seconds,
            stamp=stamp,
            host=socket.gethostname(),
            pid=os.getpid(),
            thread=threading.current_thread().name,
            watch_only=self.stamper.watch_only(),
        )
        try:
            reply = self.store.call("update_item", "adopt a handed-over lease", ReturnValues="ALL_NEW", **request)
            item = reply.get("Attributes", {})
        except ClientError as exc:
            item = self.store.old_item(exc, stored) or {}
            # Our own earlier try, its reply lost, wrote this rvn; anyone else's write did not.
            if not (item.get(it.OWNER, {}).get("S") == handover.owner and item.get(it.RVN, {}).get("S") == rvn):
                raise self._not_adopted(handover, item) from None
        info = self.keeper.info(item)
        lease = Lease(
            self.client,
            keeper=self.keeper,
            key=handover.key,
            stored_key=stored,
            owner=handover.owner,
            token=handover.token,
            lease_seconds=lease_seconds,
            sent_at=sent,
            ends_at=self.stamper.holder_end(sent, lease_seconds, stamp + lease_seconds),
            seq=seq,
            holder=dict(info.holder) if info is not None else None,
        )
        if clock_was_known and lease.is_held:
            return lease
        # Stamped by this host's wall clock (the read before it got no answer), or the reply
        # came too late to use: one renewal by DynamoDB's clock, as acquire restamps. A
        # lease that ended before it could be handed out is never returned.
        with lease.upkeep.renew_lock:
            applied, now_item = self.keeper.renew_write(lease, lease_seconds)
        if not applied:
            raise self._not_adopted(handover, now_item or {})
        if not lease.is_held:
            raise LockLost(handover.key, handover.token, "expired", "adopted, but too late to use")
        return lease

    def _not_adopted(self, handover: Handover, item: Mapping[str, Any]) -> LockLost:
        info = self.keeper.info(item)
        if info is not None and info.owner == handover.owner and info.token == handover.token:
            # Same acquisition, later write: another process adopted it first.
            return LockLost(handover.key, handover.token, "taken", "the lease was adopted by another process")
        if info is not None and info.owner is None and info.was_broken:
            return LockLost(handover.key, handover.token, "broken", f"broken: {info.break_reason or ''}")
        if info is not None and info.owner is None:
            return LockLost(handover.key, handover.token, "released", "the lease was released")
        detail = f"now held with token {info.token}" if info is not None and info.owner else "the lock item is gone"
        return LockLost(handover.key, handover.token, "taken", detail)

    def release_handover(self, handover: Handover, *, even_if_adopted: bool = False) -> bool:
        stored = self.options.prefixed(handover.key)
        try:
            self.store.call(
                "update_item",
                "release a handed-over lease",
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
                **self.keeper.release_request(
                    stored, handover.owner, handover.token, handed_seq=None if even_if_adopted else handover.seq
                ),
            )
        except ClientError as exc:
            # Released under this owner id already: by an adopter, or by an earlier try of
            # ours. Still held under it with a later seq: adopted, and the adopter's.
            return released_by(handover.owner, self.store.old_item(exc, stored))
        logger.debug("released the handed-over lease of %r (token %s)", handover.key, handover.token)
        return True
