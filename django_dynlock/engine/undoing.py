"""Undoing what an acquire that ends without a lease may have left: its writes that may
have landed unseen, a reserved turn, and (acquire_many) the keys it already got.

One try of each write, in order, and none after the first that cannot reach DynamoDB:
``wait`` stays a bound in an outage, whatever the number of keys (docs/protocol.md,
"Timeouts and retries"). What could not get through goes on in the background until
DynamoDB answers, like a failed release: once the link heals the keys are free within
seconds, not at their expiry (issue 36, N2 and N3).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from ..exceptions import DynLockError
from . import requests as rq
from .clock import ServerClock, monotonic
from .holding import RELEASE_RETRY_FOR, Keeper
from .lease import Lease
from .options import ClientOptions
from .store import Store
from .waiting import Attempt

logger = logging.getLogger("django_dynlock")

# The longest pause between two background tries of an undo (seconds). A release's
# backs off to the heartbeat period (10 s by default); an undo is one small write per
# try, for a key that nobody holds meanwhile.
UNDO_RETRY_MAX_DELAY = 1.0

UNDO = "undo an unconfirmed acquire"


@dataclass(eq=False)
class Undo:
    """What an acquisition that ended without a lease may have left on one key, still to undo."""

    stored: str
    owner: str
    reserved: bool  # our reservation of the next turn may stand: give it back
    ambiguous: bool  # an acquire write of ours may have landed: end it
    marked: bool = False  # the owner's release slot is marked: only the release is left

    @classmethod
    def of(cls, stored: str, attempt: Attempt) -> Undo:
        return cls(stored, attempt.owner, reserved=attempt.reserved, ambiguous=attempt.ambiguous)

    @property
    def done(self) -> bool:
        return not (self.reserved or self.ambiguous)


class Undoer:
    """Undo an acquire that ended without a lease, now or, if DynamoDB cannot be reached, in the background.

    Holds nothing of its own: one per client and process. It calls the store, and the
    keeper for the leases an acquire_many gives back and for its retry thread.
    """

    def __init__(
        self, options: ClientOptions, store: Store, clock: ServerClock, keeper: Keeper, *, is_closed: Callable[[], bool]
    ):
        self.options = options
        self.store = store
        self.clock = clock
        self.keeper = keeper
        self._is_closed = is_closed

    def undo(self, undos: Sequence[Undo], leases: Sequence[Lease] = ()) -> bool:
        """Undo ``undos``, then give back ``leases`` (an acquire_many that ends early).

        One try of each write, in order, and none after the first that cannot reach
        DynamoDB (before, each key's undo waited its own request timeout: 22 s for ten
        keys in an outage, and each lease given back three). What is left goes to the
        background: the undos to ``_undo_later``, the leases to the release's own retry
        (``_release_later``). Never raises; returns whether DynamoDB could be reached.
        """
        pending = [undo for undo in undos if not undo.done]
        error = self._undo_writes(pending)
        if error is not None:
            logger.warning("could not %s of %s, retrying in the background: %s", UNDO, _keys(pending), error)
            self._undo_later(pending)
        reached = error is None
        for lease in reversed(leases):
            lease.upkeep.mark_released()  # no more renewals
            if reached:
                self.keeper.release_remote(lease, quiet=True, attempts=1)
                reached = not lease.upkeep.release_pending  # else it is retried in the background
            else:
                self.keeper.release_later(lease)
        return reached

    def _undo_writes(self, pending: list[Undo]) -> DynLockError | None:
        """One try of each write left, in order, dropping from ``pending`` what is done;
        the failure that stopped it (DynamoDB could not be reached), if any."""
        while pending:
            undo = pending[0]
            try:
                if undo.reserved:
                    self._unless_changed(
                        "give up a reservation", rq.give_up_reservation(self.options, undo.stored, owner=undo.owner)
                    )
                    undo.reserved = False
                if undo.ambiguous:
                    # Mark, then release (see Keeper.end_owner): in the other order an
                    # attempt landing between the two would hold the key for nobody.
                    if not undo.marked:
                        self.store.call(
                            "update_item",
                            UNDO,
                            attempts=1,
                            hedge=True,
                            **rq.mark_slot(
                                self.options, undo.stored, owner=undo.owner, mark="undone:", now=self.clock.now()
                            ),
                        )
                        undo.marked = True
                    self._unless_changed(UNDO, self.keeper.release_request(undo.stored, undo.owner))
                    undo.ambiguous = False
            except DynLockError as error:
                return error
            del pending[0]
        return None

    def _unless_changed(self, action: str, request: dict[str, Any]) -> None:
        """One try of a write conditioned on our owner id: a failed condition means that
        nothing of ours is left to undo there (never ours, undone already, or another's now)."""
        try:
            self.store.call("update_item", action, attempts=1, hedge=True, **request)
        except ClientError:
            pass

    def _undo_later(self, pending: list[Undo]) -> None:
        """Try ``pending`` again on the client's retry thread until DynamoDB answers.

        Safe at any time, as a release retried is: the release is conditioned on our
        owner id, so it never frees a later holder (one that took the key over once our
        write's expiry passed), and the mark names only our owner. A write that landed
        and was left undone is taken over at its expiry, as before; this frees it as
        soon as DynamoDB can be reached again. Tries back off from ``min_retry_delay``
        to UNDO_RETRY_MAX_DELAY (or the heartbeat period if shorter), for at most
        RELEASE_RETRY_FOR.
        """
        since = monotonic()
        tries = 0

        def again() -> float | None:
            nonlocal tries
            if self._is_closed():
                return None
            error = self._undo_writes(pending)
            if error is None:
                logger.info("undid an unconfirmed acquire in the background")
                return None
            tries += 1
            if not getattr(error, "retryable", False) or monotonic() - since >= RELEASE_RETRY_FOR:
                logger.warning(
                    "gave up trying to %s of %s: others take it over once its expiry has passed: %s",
                    UNDO,
                    _keys(pending),
                    error,
                )
                return None
            return self._undo_delay(tries)

        self.keeper.heartbeater.retry(monotonic() + self._undo_delay(0), again)

    def _undo_delay(self, tries: int) -> float:
        backoff: float = self.options.min_retry_delay * 2 ** min(tries, 16)
        return min(UNDO_RETRY_MAX_DELAY, self.options.heartbeat_period, backoff)


def _keys(pending: Sequence[Undo]) -> str:
    shown = ", ".join(repr(undo.stored) for undo in pending[:3])
    return shown + (f" and {len(pending) - 3} more" if len(pending) > 3 else "")
