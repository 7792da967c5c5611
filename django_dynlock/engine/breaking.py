"""Operators' breaks: force-release a key, confirm a break whose replies were lost,
and tell a holder in this process at once."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from typing import Any

from botocore.exceptions import ClientError

from ..exceptions import BreakUnconfirmed, DynLockError
from . import items as it
from . import requests as rq
from .clock import ServerClock
from .events import Events
from .holding import Keeper
from .options import ClientOptions
from .store import Store
from .text import printable

logger = logging.getLogger("django_dynlock")

#: Longest break reason the admin and breaklock accept (it is stored in the item, the
#: admin log and the signal).
MAX_REASON = 500


class Breaker:
    """break_lease() and confirm_break(): the writes, the read-back, the ``broken`` event.

    Holds nothing of its own: one per client and process, over that process's store and
    clock. It calls the store, the keeper (to end the broken owner, and to tell a holder
    in this process) and the events.
    """

    def __init__(self, options: ClientOptions, store: Store, clock: ServerClock, keeper: Keeper, events: Events):
        self.options = options
        self.store = store
        self.clock = clock
        self.keeper = keeper
        self.events = events

    def break_(self, key: str, token: int | None, reason: str, by: str, *, stored: str | None = None) -> bool:
        """break_lease() after its arguments were checked; ``stored``: a semaphore's slot's item."""
        stored = stored or self.options.prefixed(key)
        mark = uuid.uuid4().hex  # the rvn this break writes: how a retry recognises it
        broken: str | None = None  # the owner it took the key from, when the reply says
        old: Mapping[str, Any] | None = None  # the item as the break found it, when the reply says
        condition, extra = rq.break_condition(token)
        try:
            reply = self.store.call(
                "update_item",
                "break a lock",
                ReturnValues="ALL_OLD",
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
                **self._break_request(stored, condition, extra, mark, reason, by),
            )
        except ClientError as exc:
            item = self.store.old_item(exc, stored)
            if not item or item.get(it.RVN, {}).get("S") != mark:
                return False
            # else: a retry after our own break was applied but its reply was lost
        except DynLockError as exc:
            if not getattr(exc, "ambiguous", False):
                raise  # never applied: nothing was broken
            # Every reply was lost, and the write may have landed: read the key back
            # rather than tell the operator that nothing was broken.
            try:
                landed = self.landed(stored, token, mark)
            except DynLockError:
                landed = None
            if landed is None:
                raise BreakUnconfirmed(key, token, mark) from exc
            if not landed:
                raise
        else:
            old = reply.get("Attributes") or None
            broken = reply.get("Attributes", {}).get(it.OWNER, {}).get("S")
            if broken is not None:
                # A copy of that holder's acquire still in the network could land on the
                # freed key and quietly undo the break. The slot is marked as broken, not
                # released: the holder's release() must not take it for its own.
                self.keeper.end_owner(
                    stored,
                    broken,
                    "make sure a broken lease leaves no late write",
                    mark=it.BREAK_PREFIX,
                    release=self._break_request(
                        stored, "#owner = :broken", {":broken": {"S": broken}}, uuid.uuid4().hex, reason, by
                    ),
                )
        self.broken(key, token, reason, by, broken, old, stored=stored)
        return True

    def landed(self, stored: str, token: int | None, mark: str) -> bool | None:
        """Read the key back after a break whose replies were all lost."""
        item = self.store.get_item(stored)
        if item is not None and item.get(it.RVN, {}).get("S") == mark:
            return True  # the break's own record version: nothing has written since
        if item is None:
            return False  # a break leaves the item (and its fence) in place
        fence = item.get(it.FENCE, {}).get("N")
        still_there = it.OWNER in item or it.RESERVED_BY in item
        if token is not None and fence == str(token) and still_there:
            return False  # the same lease still holds (or is reserved): not broken
        return None  # ended since, by this break or otherwise

    def broken(
        self,
        key: str,
        token: int | None,
        reason: str,
        by: str,
        broken: str | None,
        old: Mapping[str, Any] | None = None,
        *,
        stored: str | None = None,
    ) -> None:
        """After a break that was applied: log it (one line: who broke whose lease, and
        why), send ``broken``, tell our own holder."""
        stored = stored or self.options.prefixed(key)
        if old is not None and it.OWNER in old:
            info = it.LeaseInfo.from_item(
                old, key_attribute=self.options.key_attribute, key_prefix=self.options.key_prefix
            )
            logger.warning(
                "lock %r (token %s, held by %s) broken by %s: %s",
                key,
                info.token if token is None else token,
                printable(info.describe(user=True)),
                printable(by),
                printable(reason or "no reason given"),
            )
        else:
            logger.warning(
                "lock %r (token %s) broken by %s: %s", key, token, printable(by), printable(reason or "no reason given")
            )
        self.events.emit("broken", key=key, token=token, reason=reason, by=by)
        for lease in list(self.keeper.held):
            if lease.stored_key == stored and (token is None or lease.token == token):
                # Our own process held it: tell the holder now, not at its next heartbeat.
                # Its owner was ended above already; Keeper.lose need not do it again.
                lease.upkeep.disowned = lease.upkeep.disowned or lease.owner == broken
                self.keeper.lose(lease, "broken", printable(f"broken by {by}: {reason or 'no reason given'}"))

    def _break_request(
        self, stored: str, condition: str, values: dict[str, Any], mark: str, reason: str, by: str
    ) -> dict[str, Any]:
        """A break (see requests.break_)."""
        return rq.break_(
            self.options,
            stored,
            condition=condition,
            values=values,
            mark=mark,
            reason=reason,
            by=by,
            now=self.clock.now(),
        )
