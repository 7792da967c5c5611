"""Holding a lease: renewals, their failures, releases, and making sure a lost lease leaves no late write.

The ``Keeper`` owns the leases a client holds in its process, and its heartbeat thread.
It is what a ``Lease`` talks to (``lease.LeaseKeeper``: extend, keep_for, hand_over,
release) and what the acquirers hand a new lease to (``start``). It calls the store, the
client's ``Stamper`` and ``Events``, and ``KeyLocks.leave``; nothing above it.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from botocore.exceptions import ClientError

from ..exceptions import DynLockError, LockLost
from . import items as it
from . import observe
from . import requests as rq
from .clock import ServerClock, monotonic
from .events import Events
from .heartbeat import THREAD_NAME_PREFIX, Heartbeater
from .items import LeaseInfo
from .keylocks import KeyLocks
from .lease import Handover, Lease, LeaseState
from .options import ClientOptions, call_budget, check_seconds
from .stamps import Stamper
from .store import Store
from .text import printable

logger = logging.getLogger("django_dynlock")

# How long a release that cannot reach DynamoDB is retried in the background (seconds).
RELEASE_RETRY_FOR = 600.0

EXPIRED = "no successful renewal within the lease (DynamoDB unreachable?)"
# Late by more than this, the heartbeat thread itself is named as the cause (seconds).
LATE_HEARTBEAT = 0.05

# Seconds a throttled renewal is tried again (MAX_RETRY_DELAY apart) before its lease is
# at risk, within a third of its validity (Keeper._renewal_patience). Waiters throttled
# on the same key back off (waiting.py): the holder's renewals keep priority.
RENEWAL_PATIENCE = 1.0


class Keeper:
    """Renew, extend and release held leases; notice and report their loss.

    One per client, for its whole life; ``start_process`` gives it the state of the
    current process (a forked child holds none of its parent's leases, and a lock
    another thread held at fork stays held for ever: the child's are new).
    """

    def __init__(
        self,
        options: ClientOptions,
        events: Events,
        *,
        check_open: Callable[[], None],
        is_closed: Callable[[], bool],
    ):
        self.options = options
        self.events = events
        self._check_open = check_open
        self._is_closed = is_closed

    def start_process(self, store: Store, clock: ServerClock, stamper: Stamper, keylocks: KeyLocks) -> None:
        """This process's state: none of the leases another process held (see after_fork)."""
        self.store = store
        self.clock = clock
        self.stamper = stamper
        self.keylocks = keylocks
        self.pid = os.getpid()
        self._lock = threading.Lock()
        self.held: set[Lease] = set()
        self.heartbeater = Heartbeater(self.heartbeat, name=THREAD_NAME_PREFIX + self.options.alias)

    def after_fork(self) -> None:
        """In a forked child, before start_process: the parent keeps renewing its leases,
        and the child must neither renew nor release them."""
        for lease in list(self.held):
            lease.upkeep.after_fork()
            lease.upkeep.mark_lost("fork", "a forked child does not own its parent's leases")

    def period(self, lease_seconds: float) -> float:
        return min(self.options.heartbeat_period, lease_seconds / 3.0)

    def start(self, lease: Lease, *, waited: float) -> None:
        """Hold ``lease``: it is among held(), renewed, and its holder told (``acquired``)."""
        with self._lock:
            self.held.add(lease)
        self.heartbeater.add(lease, self._first_heartbeat(lease))
        logger.debug(
            "acquired %r (token %s) after %.3fs and %d look(s)", lease.key, lease.token, waited, lease.upkeep.looks
        )
        self.events.emit("acquired", lease, waited=waited)

    def renew_early(self, lease: Lease) -> None:
        """Renew ``lease`` before it is held (acquire_many's keys until all are ours)."""
        self.heartbeater.add(lease, self._first_heartbeat(lease))

    def _first_heartbeat(self, lease: Lease) -> float:
        # The first renewal comes early if the first write left a short validity.
        return min(self.period(lease.lease_seconds), max(lease.remaining() / 2, self.options.min_retry_delay))

    def stop(self, lease: Lease) -> None:
        """No longer hold ``lease`` in this process: no renewals, its key free to this process's threads."""
        with self._lock:
            if lease not in self.held:
                return
            self.held.discard(lease)
        self.keylocks.leave(lease.stored_key)
        self.heartbeater.discard(lease)

    def info(self, item: Mapping[str, Any] | None) -> LeaseInfo | None:
        """The item as a LeaseInfo (None for no item), read with this client's key attribute and prefix."""
        if not item:
            return None
        return LeaseInfo.from_item(item, key_attribute=self.options.key_attribute, key_prefix=self.options.key_prefix)

    def renew_write(self, lease: Lease, lease_seconds: float) -> tuple[bool, dict[str, Any] | None]:
        """One renewal write: (True, None) when applied, else (False, the item that shows it is not ours).

        Raises DynLockError when DynamoDB cannot be reached. The caller holds
        ``lease.upkeep.renew_lock``: renewals of one lease go out one at a time.
        """
        seq = lease.upkeep.seq = lease.upkeep.seq + 1
        sent = monotonic()
        stamp = self.stamper.stamp(sent)
        expires = stamp + lease_seconds
        try:
            request = rq.renew(
                self.options,
                lease.stored_key,
                owner=lease.owner,
                rvn=uuid.uuid4().hex,
                seq=seq,
                lease_seconds=lease_seconds,
                stamp=stamp,
                watch_only=self.stamper.watch_only(),
            )
            lease.upkeep.renewal_sent = sent
            self.store.call(
                "update_item", "renew a lease", throttled_for=self._renewal_patience(lease), hedge=True, **request
            )
        except ClientError as exc:
            item = self.store.old_item(exc, lease.stored_key)
            # Still ours with this write's number (or a later one): an earlier try of this
            # same write was applied and its reply lost.
            if not (item and item.get(it.OWNER, {}).get("S") == lease.owner and (it.number(item, it.SEQ) or 0) >= seq):
                return False, item
        finally:
            lease.upkeep.renewal_sent = None
        lease.upkeep.last_renewal_took = monotonic() - sent
        if observe.OBSERVERS:
            # What was left of the validity this renewal replaces when its reply came.
            observe.tell_renewed(self.options.alias, lease.metrics_name, lease.upkeep.valid_until - monotonic())
        if lease.upkeep.renewed(sent, lease_seconds, self.stamper.holder_end(sent, lease_seconds, expires)):
            self.events.emit("recovered", lease)
        return True, None

    def _renewal_patience(self, lease: Lease) -> float:
        """How long a throttled renewal keeps asking before the lease is at risk: a third
        of what is left of its validity, at most RENEWAL_PATIENCE (the heartbeat thread
        renews the client's other leases too)."""
        return max(0.0, min(RENEWAL_PATIENCE, (lease.valid_until - monotonic()) / 3))

    def renew_once(self, lease: Lease, lease_seconds: float) -> None:
        """One renewal; raises LockLost if the lease is gone, DynLockError on failure."""
        applied, item = self.renew_write(lease, lease_seconds)
        if not applied:
            reason, detail = self.why_not_ours(lease, item)
            self.lose(lease, reason, detail)
            raise lease.upkeep.lost or LockLost(lease.key, lease.token, reason, detail)

    def lose(self, lease: Lease, reason: str, detail: str) -> None:
        """Mark a lease lost, free its in-process key lock and tell the listeners (once)."""
        if lease.upkeep.mark_lost(reason, detail):
            logger.warning("%r lost: %s", lease, lease.upkeep.lost)
            self.stop(lease)
            self.events.emit("lost", lease, reason=reason)
            if reason in ("taken", "broken", "released"):  # the item shows it is not ours
                self.disown(lease)

    def why_not_ours(self, lease: Lease, item: Mapping[str, Any] | None) -> tuple[str, str]:
        info = self.info(item)
        if info is None:
            return "taken", "the lock item is gone"
        if info.owner is None and info.was_broken:
            return "broken", printable(
                f"broken by {(info.released_by or '')[len(it.BREAK_PREFIX) :]}: {info.break_reason or 'no reason given'}"
            )
        if info.owner is None:
            return "released", "the lease was released"
        return "taken", printable(f"now held by {info.describe()} with token {info.token}")

    def extend(self, lease: Lease, lease_seconds: float | None) -> None:
        self._check_open()
        new = _lease_seconds(lease_seconds if lease_seconds is not None else lease.lease_seconds)
        lease.raise_if_lost()
        self._renew_for_caller(lease, new)
        # The next renewal follows the new lease's period, not the old one's.
        self.heartbeater.add(lease, self.period(new))

    def _renew_for_caller(self, lease: Lease, lease_seconds: float) -> None:
        """extend()'s and keep_for()'s write, on the caller's thread.

        An exception the caller's own code raises into it (KeyboardInterrupt, a signal
        handler, a task's soft time limit) reaches the caller as raised, and the write
        it interrupted, which may have landed with terms the lease does not know of, is
        rolled back: the heartbeat renews at once with the lease's own (a later sequence
        number, so that the interrupted write cannot land after it).
        """
        with lease.upkeep.renew_lock:
            try:
                self.renew_once(lease, lease_seconds)
            except DynLockError:
                raise
            except BaseException:
                self.heartbeater.schedule(lease, monotonic())
                raise

    def keep_for(self, lease: Lease, seconds: float) -> None:
        self._check_open()
        seconds = check_seconds("seconds", seconds)  # type: ignore[assignment]
        lease.raise_if_lost()
        self._renew_for_caller(lease, seconds)
        # From here on nobody renews or releases it: the lease simply runs out, and any
        # acquire takes the key once its expiry has passed by DynamoDB's clock.
        lease.upkeep.mark_released()
        self.stop(lease)
        held = monotonic() - lease.acquired_monotonic
        logger.debug(
            "left %r (token %s) to run out in %.3fs, after holding it %.3fs", lease.key, lease.token, seconds, held
        )
        self.events.emit("released", lease, held=held)

    def hand_over(self, lease: Lease, keep: float | None) -> Handover:
        """``Lease.hand_over``: stop renewing and releasing ``lease`` here (handover.py for the receiving side)."""
        self._check_open()
        lease.raise_if_lost()
        with lease.upkeep.renew_lock:
            if keep is not None:
                # One renewal write: the lease now ends `keep` seconds ahead, whoever renews it next.
                self.renew_once(lease, _lease_seconds(keep))
            handover = Handover(key=lease.key, owner=lease.owner, token=lease.token, seq=lease.upkeep.seq)
            # From here on this process neither renews nor releases it.
            lease.upkeep.mark_released()
        self.stop(lease)
        held = monotonic() - lease.acquired_monotonic
        logger.debug("handed over %r (token %s) after holding it %.3fs", lease.key, lease.token, held)
        self.events.emit("released", lease, held=held)
        return handover

    def heartbeat(self, lease: Lease) -> float | None:
        """Renew one lease for the heartbeat thread; return the delay to the next renewal."""
        if lease.upkeep.release_pending:
            lease.upkeep.release_pending = False
            self.release_remote(lease, quiet=True)  # schedules itself again if it fails again
            return None
        if not lease.needs_renewal or self._is_closed():
            return None
        period = self.period(lease.lease_seconds)
        if monotonic() >= lease.valid_until:
            self.lose(lease, "expired", self._why_expired(lease))
            return None
        self._lose_on_time(lease)
        try:
            with lease.upkeep.renew_lock:
                self.renew_once(lease, lease.lease_seconds)
        except LockLost:
            return None
        except DynLockError as exc:
            if lease.upkeep.mark_at_risk():
                logger.warning("renewing %r failed, lease at risk: %s", lease, exc)
                self.events.emit("at_risk", lease, error=exc)
            # Retry well before the lease runs out; the loop marks it lost at its end.
            return self._retry_delay(lease)
        return period * random.uniform(0.85, 1.0)

    def _lose_on_time(self, lease: Lease) -> None:
        """Have the ``lost`` event sent when the validity ends, even if the renewal about to
        be sent is still in flight then.

        The heartbeat thread notices an ended validity only between requests: a renewal
        hanging until its timeout (an outage, a blackholed connection) made ``lost`` come
        that much late, after a taker could already hold the key. The holder's own checks
        (``is_held``, ``raise_if_lost``) read the clock and were never late; listeners
        (the ``lock_lost`` signal) were. Armed only when this renewal could outlast the
        validity, its throttled retries (``_renewal_patience``) included: with settings
        that pass dynlock.W001 (a call takes at most half the lease), the retries of a
        lease at risk, and the renewals of a short lease.
        """
        end = lease.valid_until
        left = end - monotonic()
        longest = call_budget(self.options.client_config) + self._renewal_patience(lease)
        if left > longest or lease.upkeep.watched_end == end:
            return
        lease.upkeep.watched_end = end
        self.heartbeater.alarm(end, lambda: self._lose_if_ended(lease, end))

    def _lose_if_ended(self, lease: Lease, end: float) -> None:
        # A renewal that succeeded meanwhile moved the end: nothing was lost.
        if lease.needs_renewal and lease.valid_until == end and monotonic() >= end and not self._is_closed():
            self.lose(lease, "expired", self._why_expired(lease))

    def _why_expired(self, lease: Lease) -> str:
        """EXPIRED, with what this process saw: a renewal left unanswered (DynamoDB slow or
        unreachable), or a heartbeat thread that came too late (this process paused or
        starved of CPU), so that an operator knows which of the two to look at."""
        upkeep = lease.upkeep
        now = monotonic()
        facts = []
        if upkeep.renewal_sent is not None:
            facts.append(f"a renewal sent {now - upkeep.renewal_sent:.2f}s ago is still unanswered")
        elif (
            upkeep.heartbeat_due
            and upkeep.heartbeat_due < upkeep.valid_until
            and now - upkeep.valid_until > LATE_HEARTBEAT
        ):
            facts.append(
                f"the heartbeat thread ran {now - upkeep.heartbeat_due:.2f}s after the renewal was due and "
                f"{now - upkeep.valid_until:.2f}s after the validity ended (this process was paused or starved of CPU)"
            )
        if upkeep.last_renewal_took is not None:
            facts.append(f"the last renewal took {upkeep.last_renewal_took:.2f}s")
        if not facts:
            return EXPIRED
        return f"no successful renewal within the lease: {'; '.join(facts)}"

    def _retry_delay(self, lease: Lease) -> float:
        left = max(0.0, lease.valid_until - monotonic())
        return max(self.options.min_retry_delay, min(self.period(lease.lease_seconds) / 3, left / 3))

    def release(self, lease: Lease) -> None:
        observed = (
            observe.start_release(self.options.alias, lease.metrics_name, lease.key) if observe.OBSERVERS else None
        )
        if observed is None:
            return self._release(lease)
        try:
            self._release(lease)
        except BaseException as error:
            outcome = "lost" if isinstance(error, LockLost) else "error"
            observed.end(outcome, held=monotonic() - lease.acquired_monotonic, error=error)
            raise
        observed.end("released", held=monotonic() - lease.acquired_monotonic, error=None)
        return None

    def _release(self, lease: Lease) -> None:
        if os.getpid() != self.pid:
            self._check_open()
        if lease.upkeep.state is LeaseState.RELEASED:
            raise LockLost(lease.key, lease.token, "released", "release() was already called")
        try:
            if lease.upkeep.state is LeaseState.LOST and lease.lost_reason != "expired":
                raise lease.upkeep.lost or LockLost(lease.key, lease.token, "taken")
            if self._is_closed():
                raise LockLost(lease.key, lease.token, "expired", "the lock client was closed before release")
            # Ran out before release: free the key if nobody took it, and say so all the same.
            expired = not lease.is_held
            self.release_remote(lease, quiet=False)
            if expired:
                self.lose(
                    lease, "expired", "the lease ran out before release(): the work may have overlapped another holder"
                )
                raise lease.upkeep.lost or LockLost(lease.key, lease.token, "expired")
        finally:
            lease.upkeep.mark_released()
            self.stop(lease)
        held = monotonic() - lease.acquired_monotonic
        logger.debug("released %r (token %s) after holding it %.3fs", lease.key, lease.token, held)
        self.events.emit("released", lease, held=held)

    def release_remote(self, lease: Lease, *, quiet: bool, attempts: int | None = None) -> None:
        """The release write. On success the item keeps its fence and loses its owner.

        ``quiet`` (a retry in the background): never raises, and stops once the item
        shows the key is no longer ours. ``attempts``: tries of each request (the call's
        default if None; one where an acquire gives its keys back, see Undoer.undo).
        """
        try:
            self.store.call(
                "update_item",
                "release a lock",
                attempts=attempts,
                hedge=True,
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
                **self.release_request(lease.stored_key, lease.owner, lease.token),
            )
        except ClientError as exc:
            try:
                item = self.store.old_item(exc, lease.stored_key, attempts=attempts)
            except DynLockError as read_error:
                # Our release may well have been applied (its reply lost); we cannot tell
                # now. Trying it again will: it recognises its own earlier success.
                if not quiet:
                    logger.warning(
                        "could not confirm the release of %r, retrying in the background: %s", lease, read_error
                    )
                self.release_later(lease)
                return
            if self._released_by_us(lease, item):
                return
            reason, detail = self.why_not_ours(lease, item)
            if quiet:
                # Taken or broken meanwhile: release() had returned, so this is the holder's
                # only word of it (docs/protocol.md, "Release").
                logger.warning("%r ended before its release got through: %s; %s", lease, reason, detail)
                self.events.emit("lost", lease, reason=reason)
                self.disown(lease)
                return
            self.lose(lease, reason, detail)
            raise lease.upkeep.lost or LockLost(lease.key, lease.token, reason, detail) from None
        except DynLockError as exc:
            if not quiet:
                # The work ran under a valid lease; only freeing it early failed.
                logger.warning("could not release %r, retrying in the background: %s", lease, exc)
            self.release_later(lease)
        except BaseException:
            # Raised into the request by the caller's own code (KeyboardInterrupt, a signal
            # handler, a task's soft time limit): it reaches the caller, and the release,
            # which may not have landed, goes on in the background.
            self.release_later(lease)
            raise

    @staticmethod
    def _released_by_us(lease: Lease, item: Mapping[str, Any] | None) -> bool:
        """Whether a release whose condition failed had an earlier try of its own applied (see released_by)."""
        return released_by(lease.owner, item)

    def release_request(
        self, stored: str, owner: str, fence: int | None = None, *, handed_seq: int | None = None
    ) -> dict[str, Any]:
        """The release write of ``owner`` (see requests.release)."""
        now = self.clock.now()
        return rq.release(
            self.options, stored, owner=owner, fence=fence, rvn=uuid.uuid4().hex, now=now, handed_seq=handed_seq
        )

    def release_later(self, lease: Lease) -> None:
        """Have the heartbeat thread try a failed release again, until it is confirmed.

        Safe to repeat at any time: the release is conditioned on our owner id and
        recognises its own earlier success, and once the item shows another owner the
        retries stop. Without them the key would stay held until its expiry passed.
        Bounded by RELEASE_RETRY_FOR, with a backoff up to the heartbeat period.
        """
        now = monotonic()
        if lease.upkeep.release_since is None:
            lease.upkeep.release_since = now
        if self._is_closed() or now - lease.upkeep.release_since >= RELEASE_RETRY_FOR:
            logger.warning("gave up releasing %r: others take it over once its expiry has passed", lease)
            return
        delay = min(
            self.period(lease.lease_seconds), self.options.min_retry_delay * 2 ** min(lease.upkeep.release_tries, 16)
        )
        lease.upkeep.release_tries += 1
        lease.upkeep.release_pending = True
        self.heartbeater.schedule(lease, now + delay)

    def end_owner(
        self,
        stored: str,
        owner: str,
        action: str,
        *,
        mark: str,
        release: dict[str, Any] | None = None,
        attempts: int | None = None,
    ) -> None:
        """Make sure no write of ``owner`` holds the key, now or later: no ghost holder.

        An acquire of ours delayed in the network may land at any time while the key is
        free: after we gave up waiting for its reply, after a break, after a taker's
        release. First mark ``owner``'s release slot, whoever holds the key, so that
        none can land from then on (items.RELEASE_SLOTS); then release the key in case
        one landed before the mark. In the other order, one landing between the two
        writes would hold the key for nobody until its expiry passed.

        ``mark`` prefixes the tag: the acquire guard looks for the tag anywhere in the
        slot, but a release recognises its own earlier success by the bare tag alone,
        which these marks must never look like. ``release`` replaces the owner's own
        release write.
        """
        marked = self.store.try_update(
            action,
            attempts=attempts,
            hedge=True,
            **rq.mark_slot(self.options, stored, owner=owner, mark=mark, now=self.clock.now()),
        )
        if marked is not None:  # else DynamoDB cannot be reached: the release would not get through either
            self.store.try_update(
                action, attempts=attempts, hedge=True, **(release or self.release_request(stored, owner))
            )

    def disown(self, lease: Lease) -> None:
        """After a lease was taken from us or broken: no late write of ours may hold the key (two writes, on losses only)."""
        if not lease.upkeep.disowned:
            lease.upkeep.disowned = True
            self.end_owner(lease.stored_key, lease.owner, "make sure a lost lease leaves no late write", mark="lost:")


def _lease_seconds(value: float) -> float:
    return check_seconds("lease", value)  # type: ignore[return-value]


def released_by(owner: str, item: Mapping[str, Any] | None) -> bool:
    """Whether the item shows a release by ``owner``: a release whose condition failed
    had an earlier try of its own applied, or a handed-over lease was released by its
    adopter or by an earlier try of ours.

    That try, its reply lost, wrote the owner id, and its tag into its release slot
    and into its fence's place in the release ring (items.RING), which the releases
    of the next holders keep. Breaks and takeovers write none of them.
    (Guessing from the fence instead read a break followed by another holder's
    acquire and release as our own release: issue 13, finding 3.)
    """
    if not item:
        return False
    slot, tag = it.release_slot(owner)
    return item.get(it.RELEASED_BY, {}).get("S") == owner or item.get(slot, {}).get("S") == tag or it.in_ring(item, tag)
