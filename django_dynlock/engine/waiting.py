"""The waiting policy: when a waiter may take a busy key, and how long it sleeps between looks.

Pure decisions on what a waiter has seen (the item, its watch of the holder's record
version, DynamoDB's clock as bounded by ``clock.py``) and its own monotonic clock.
The acquire loops in ``acquiring.py`` and ``multikey.py`` send the requests; this
module tells them when, and whether a write may take the key over.
"""

from __future__ import annotations

import random
import threading
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..exceptions import DynLockError
from . import items as it
from .clock import DRIFT, ServerClock, monotonic
from .items import LeaseInfo
from .lease import Lease
from .options import ClientOptions
from .requests import RESERVATION_GRACE
from .store import backoff

# A waiter sleeps at least this many of its last round trips between looks at a busy key,
# but never more than this many MAX_RETRY_DELAYs for that reason.
POLL_ROUND_TRIPS = 4
POLL_DELAY_CAP = 10
# A waiter that sees another waiter has the next turn looks this many MAX_RETRY_DELAYs apart
# (0.4 s by default): its turn comes after that one's, and on a hot key (24 processes, 5 ms
# sections) looking 0.1 s apart cost 11-17 requests a section, 0.4 s apart about 7, with
# more sections a second, not fewer.
RESERVED_POLL = 16
# The waiter with the next turn looks by writing this many times, then by reading.
RESERVED_WRITES = 8
# A waiter that has waited this long (seconds), and seen the key go to others
# meanwhile, reserves the next turn.
STARVING_AFTER = 0.1
# What a client remembers of busy keys between calls (their record versions), so that
# repeated short attempts add up to a watch of a whole lease. A watch it forgets that
# only it can take the key by (no expiry to go by) is written into the key's item, and
# read back from there (see WaitPolicy.remember): dropped from memory, it went on
# ripening all the same. Before, a client trying 1,100 such keys round-robin forgot
# each watch before the key came round again and took over none of them (issue 36).
WATCHES_KEPT = 1024
# The cost of waiting follows how long the key has been held: a waiter looks at most
# HOLD_SLACK + HOLD_SHARE of the hold's age apart, so it learns of a release within
# 0.1 s + 5 % of the hold (the rest of the 0.1 s is the read's and the acquire's round
# trips), and a 40 s hold costs about 75 requests, not 1,600. Early on the pause grows
# only to HOLD_RAMP of the age. Issue 28 set it to 0.15 so that a 0.1-0.2 s hold was
# polled under MAX_RETRY_DELAY apart (at 0.3 a waiter slept 30-60 ms there, handoff p50
# 2.0-2.5 x python-dynamodb-lock (fast)'s); the young pace below polls those holds now,
# and after it the ramp is back at 0.3: the looks it saves over 0.2-0.9 s of a 40 s hold
# pay for the young pace's (the test's 79 requests on a warm server, 80 asked). Before
# HOLD_YOUNG it stays at HOLD_RAMP_YOUNG, so that a hold younger than 0.1 s is polled
# as before, under MAX_RETRY_DELAY apart (at 0.3, 30 ms apart at 0.1 s).
# The downward jitter (to HOLD_JITTER) keeps independent pollers apart without ever
# looking later than the bound.
HOLD_SLACK = 0.09
HOLD_SHARE = 0.0495
HOLD_RAMP = 0.3
HOLD_RAMP_YOUNG = 0.15
HOLD_JITTER = 0.98
# A hold aged HOLD_YOUNG_FROM to HOLD_YOUNG (seconds) is polled at the young pace: the
# backoff with its step stopped at YOUNG_STEP MAX_RETRY_DELAYs (7.5-15 ms apart by
# default), over a floor of YOUNG_ROUND_TRIPS round trips, without the hold's ramp. Most
# holds are short, and after one the handoff is the rest of the pause, then a read and a
# write: at the backoff's 12.5-25 ms, the ramp and four round trips (25 ms at the median)
# its p50 after 0.1-0.2 s holds was 0.9-1.7 x python-dynamodb-lock's polling every 20 ms
# in the same runs. Its looks come out of a 40 s hold's budget (80 requests, 79 sent
# before on a warm server): from the hold's start it cost 84-85, so a hold younger than
# 0.1 s is polled as before, and the ramp after 0.2 s is steeper (HOLD_RAMP); at a step
# of 0.5 (6.25-12.5 ms) the budget was spent to the last request (80). Measured in
# docs/benchmarks.md ("Handoff at the best peer's"), reasoning in docs/protocol.md.
HOLD_YOUNG_FROM = 0.1
HOLD_YOUNG = 0.2
YOUNG_STEP = 0.6
YOUNG_ROUND_TRIPS = 2
# Each throttled look in a row doubles the next pause, up to this many times: a
# throttled partition is short of read units, and the holder's renewals need them more.
THROTTLE_DOUBLINGS = 6


@dataclass
class Attempt:
    """One acquisition's attempts: its owner id, the sequence number of its last write,
    whether a write may have landed unseen (sent, and no answer yet said it did not; or
    applied, and its lease not yet handed out), and whether it holds the next turn."""

    owner: str
    seq: int = 0
    ambiguous: bool = False
    reserved: bool = False
    looks: int = 0  # writes, reads or transactions sent to look at the key


@dataclass
class Watch:
    """A waiter's observation of a holder's record version, on its own monotonic clock,
    and of the holder itself: ``held_since`` is when it first saw that owner hold the key
    (renewals change the record version, not the holder)."""

    rvn: str | None
    since: float
    lease_seconds: float
    holder: str | None = None
    held_since: float = 0.0
    # Looks in a row that DynamoDB throttled: the next call on the key goes on backing off.
    throttled: int = 0
    # Only this watch can take the key over (it has no expiry, or DynamoDB's clock is
    # unknown): forgotten, it is written into the item. ``noted``: it is there already.
    needed: bool = False
    noted: bool = False

    def held_for(self, now: float) -> float:
        """How long the current holder has held the key, as far as this waiter has seen."""
        return now - self.held_since if self.holder is not None else 0.0

    def takeover_at(self) -> float:
        return self.since + self.lease_seconds

    def takeover_rvn(self, now: float) -> str | None:
        """The record version a write may take over now: watched unchanged for a whole lease."""
        return self.rvn if self.rvn and now >= self.takeover_at() else None


class WaitPolicy:
    """A client's waiting decisions, and its memory of busy keys between calls. Thread-safe."""

    def __init__(self, options: ClientOptions, clock: ServerClock):
        self.options = options
        self.clock = clock
        self._lock = threading.Lock()
        self._watches: OrderedDict[str, Watch] = OrderedDict()
        # Names this client's notes in items: its watches' times are on this process'
        # monotonic clock, which no other host's reading of the note could compare. A
        # forked child starts with an empty memory and a name of its own.
        self.note_attribute = it.WATCH_NOTE_PREFIX + uuid.uuid4().hex[:16]

    # -- what a client remembers of busy keys ---------------------------------------
    def remembered(self, stored: str) -> Watch | None:
        with self._lock:
            return self._watches.get(stored)

    def remember(self, stored: str, watch: Watch | None) -> list[tuple[str, Watch]]:
        """Keep ``watch`` of ``stored`` (None: forget it); returns the watches dropped for
        it that must be written into their items (``note``), least recently used first.

        Memory stays at WATCHES_KEPT keys. A watch that only it can take its key by, and
        that its item does not hold yet, is not lost when dropped: the caller writes it
        there, and the next look at the key reads it back (``observe``). Without that, a
        client trying more keys than it remembers, round-robin, dropped every watch
        before the key came round again, and no dead holder's key was ever taken.
        """
        spilled: list[tuple[str, Watch]] = []
        with self._lock:
            if watch is None:
                self._watches.pop(stored, None)
                return spilled
            self._watches[stored] = watch
            self._watches.move_to_end(stored)
            while len(self._watches) > WATCHES_KEPT:
                # The least recently used watch that costs nothing to drop (its item has
                # it, or the key's expiry decides), if any: a client going round more keys
                # than it remembers then writes each watch into its item once, not once a
                # round.
                free = next((s for s, w in self._watches.items() if s != stored and not self._spills(w)), None)
                if free is not None:
                    del self._watches[free]
                    continue
                dropped, forgotten = self._watches.popitem(last=False)
                spilled.append((dropped, forgotten))
        return spilled

    @staticmethod
    def _spills(watch: Watch) -> bool:
        """Whether dropping ``watch`` loses what only it knows: it is written into its item then."""
        return watch.needed and not watch.noted and bool(watch.rvn)

    @staticmethod
    def note(watch: Watch) -> str:
        """The note of ``watch`` that its item keeps: the record version and when it was first seen."""
        return f"{watch.rvn} {watch.since!r}"

    def _noted_since(self, item: Mapping[str, Any], rvn: str | None, received: float) -> float | None:
        """When this client first saw ``rvn``, as its note in ``item`` says; None without one.

        Only a note of this very record version counts: any write to the key since gave
        it another, which restarts the watch as ever.
        """
        note = item.get(self.note_attribute, {}).get("S")
        if not note or not rvn:
            return None
        noted_rvn, _, since = note.partition(" ")
        try:
            at = float(since)
        except ValueError:
            return None
        # Later than this look it cannot be (one clock): such a note is not ours to trust.
        return at if noted_rvn == rvn and at <= received else None

    # -- when a key may be taken ---------------------------------------------------------
    def expired(self, item: Mapping[str, Any] | None, at: float) -> bool:
        """Whether DynamoDB's clock, even at its earliest reading, lets us take the key (see below)."""
        due = self.takeover_by_clock_in(item, at)
        return due is not None and due <= 0

    def takeover_by_clock_in(self, item: Mapping[str, Any] | None, at: float) -> float | None:
        """Seconds until DynamoDB's clock lets us take the key: the holder's expiry, or a lapsed reservation."""
        earliest = self.clock.earliest(at)
        if not item or earliest is None:
            return None
        if it.OWNER in item:
            deadline = it.number(item, it.EXPIRES_AT)
        elif it.RESERVED_BY in item:
            released = it.number(item, it.RELEASED_AT)
            deadline = None if released is None else released + RESERVATION_GRACE
        else:
            return None
        # The earliest reading grows a little slower than our clock (DRIFT).
        return None if deadline is None else (deadline - earliest) / (1.0 - DRIFT)

    def takeover_in(self, item: Mapping[str, Any] | None, watch: Watch | None, at: float) -> float | None:
        """Seconds until a write may take a busy key: by DynamoDB's clock, or after watching it a whole lease."""
        due = [
            d
            for d in (self.takeover_by_clock_in(item, at), watch.takeover_at() - at if watch else None)
            if d is not None
        ]
        return min(due) if due else None

    def observe(self, watch: Watch | None, item: Mapping[str, Any] | None, received: float, owner: str) -> Watch | None:
        """Update the watch on the holder's record version; None when the key is free for ``owner``.

        A released key that another waiter has reserved counts as held until the
        reservation lapses (RESERVATION_GRACE after the release, by DynamoDB's clock).
        """
        if not item:
            return None
        if it.OWNER not in item:
            reserver = item.get(it.RESERVED_BY, {}).get("S", owner)
            if reserver == owner or self.expired(item, received):
                return None
        rvn = item.get(it.RVN, {}).get("S")
        if watch is not None and watch.rvn == rvn:
            return watch
        holder = item.get(it.OWNER, {}).get("S")
        held_since = watch.held_since if watch is not None and watch.holder == holder else received
        lease_ms = float(item.get(it.LEASE_MS, {}).get("N", self.options.lease_duration * 1000))
        throttled = watch.throttled if watch is not None else 0
        # A watch this client forgot, and wrote into the item, goes on from where it began.
        noted = self._noted_since(item, rvn, received)
        return Watch(
            rvn,
            received if noted is None else noted,
            lease_ms / 1000.0,
            holder=holder,
            held_since=held_since if noted is None else min(held_since, noted),
            throttled=throttled,
            needed=holder is not None and self.takeover_by_clock_in(item, received) is None,
            noted=noted is not None,
        )

    def retry_after(
        self,
        info: LeaseInfo | None,
        item: Mapping[str, Any] | None,
        watch: Watch | None,
        *,
        handoffs: int = 0,
        waited: float = 0.0,
    ) -> float | None:
        """The hint a LockNotAcquired carries: how long the key will likely stay busy.

        From what the waiter saw: holders that came and went while it waited held the
        key about ``waited / handoffs`` each; without any, a holder that has held the
        key a while is as likely to hold it about as long again (the hold's age, from
        this waiter's watch or the item's ``acquired_at`` by DynamoDB's clock). Never
        later than the key can be taken over (a lease at most), never sooner than a poll
        (``busy_for``).
        """
        if info is None or not info.is_held:
            return None
        now = monotonic()
        age = watch.held_for(now) if watch is not None else 0.0
        acquired = it.number(item, it.ACQUIRED_AT) if item else None
        if acquired is not None and self.clock.known:
            age = max(age, self.clock.now() - acquired)
        due = self.takeover_in(item, watch, now)
        latest = max(0.0, due) if due is not None else info.lease_seconds
        return self.busy_for(waited / handoffs if handoffs else age, latest)

    def retry_after_local(self, lease: Lease) -> float:
        """``retry_after`` for a key another thread of this process holds (the in-process gate).

        The same rule, from what this process knows for certain: the hold's age since it
        began here (an acquire, or an adopt), and the rest of the holder's validity. Its
        renewals go on, so the key may stay busy longer; but a lease-long hint for a key
        held 50 ms made every request behind it wait 30 s for nothing.
        """
        return self.busy_for(monotonic() - lease.acquired_monotonic, lease.remaining())

    def busy_for(self, likely: float, latest: float | None) -> float:
        """How long a key will likely stay busy: ``likely`` (a hold's age, or the holds seen
        while waiting), never past ``latest`` (when it can be taken over, if known), and
        never sooner than a poll: a hint of 0 would have callers ask again at once."""
        hint = max(likely, self.options.max_retry_delay)
        if latest is not None:
            hint = min(hint, latest)
        return max(hint, self.options.max_retry_delay)

    # -- the next turn ---------------------------------------------------------------------
    def starving(self, item: Mapping[str, Any], owner: str, holders_seen: set[str], began: float) -> bool:
        """Whether this waiter has waited a while, seen the key change hands, and nobody has the next turn."""
        current = item.get(it.OWNER, {}).get("S")
        if current is None or current == owner:
            return False
        if len(holders_seen) < 2:  # all we need to know: the key changed hands
            holders_seen.add(current)
        return len(holders_seen) > 1 and monotonic() - began >= STARVING_AFTER and it.RESERVED_BY not in item

    @staticmethod
    def looks_by_writing(reserved_looks: int, returns_item_on_failure: bool | None) -> bool:
        """Whether the waiter with the next turn looks by writing.

        Its attempt lands as soon as the key is free, a round trip sooner than a read
        and then a write, and a failed one returns the item, like a read. Only its
        first few looks: a failed write costs five times a read, and a long hold
        would add up.
        """
        return bool(returns_item_on_failure) and 0 < reserved_looks <= RESERVED_WRITES

    # -- sleeps ----------------------------------------------------------------------------
    def busy_server_delay(self, took: float, error: DynLockError | None, round_trips: int = POLL_ROUND_TRIPS) -> float:
        """At least a few round trips between polls: on a busy server, faster polls would
        only queue our reads in front of the holder's release. A failed look (a timeout,
        a reset) says nothing about load, and a cap keeps one slow reply from stalling a
        waiter."""
        if error is not None:
            return 0.0
        return min(round_trips * took, POLL_DELAY_CAP * self.options.max_retry_delay) * random.uniform(0.75, 1.25)

    def young_backoff(self, tries: int) -> float:
        """The backoff of the young pace: its step stops at YOUNG_STEP MAX_RETRY_DELAYs."""
        top = max(YOUNG_STEP * self.options.max_retry_delay, self.options.min_retry_delay)
        step: float = min(top, self.options.min_retry_delay * 2.0 ** min(tries, 16))
        return step / 2 + random.uniform(0, step / 2)

    @staticmethod
    def young(watch: Watch | None, now: float) -> bool:
        """Whether the key's holder, as this waiter has seen it, is of the young pace's age."""
        return watch is not None and watch.holder is not None and HOLD_YOUNG_FROM <= watch.held_for(now) < HOLD_YOUNG

    @staticmethod
    def hold_delay(watch: Watch | None, now: float) -> float:
        """The pause that follows the hold's age: see HOLD_SHARE."""
        age = watch.held_for(now) if watch is not None else 0.0
        if age <= 0:
            return 0.0
        ramp = HOLD_RAMP if age >= HOLD_YOUNG else HOLD_RAMP_YOUNG
        return min(ramp * age, HOLD_SLACK + HOLD_SHARE * age) * random.uniform(HOLD_JITTER, 1.0)

    def poll_delay(
        self,
        *,
        tries: int,
        reserved: bool,
        took: float,
        error: DynLockError | None,
        item: Mapping[str, Any] | None,
        watch: Watch | None,
        now: float,
        give_up_at: float,
        throttled: int = 0,
        handoffs: int = 0,
    ) -> float:
        """How long a waiter for one key sleeps before its next look.

        ``throttled``: how many looks in a row DynamoDB throttled. ``handoffs``: how many
        times this waiter saw the key change hands.
        """
        if reserved:
            # The waiter with the next turn polls at the first step (the key idles until
            # it looks), but no more often than the hold's age asks.
            delay = max(backoff(self.options, 0), self.hold_delay(watch, now))
        elif not handoffs and self.young(watch, now):
            # Not on a key seen changing hands: there many waiters poll, and a holder
            # seen for 0.1 s is one descheduled mid-section, not a hold about to end
            # (24 processes on a 5 ms hot key read 1.2-1.3 times a section with it,
            # 1.0-1.15 without).
            delay = max(
                self.young_backoff(tries),
                self.busy_server_delay(took, error, YOUNG_ROUND_TRIPS),
            )
        else:
            delay = max(backoff(self.options, tries), self.busy_server_delay(took, error), self.hold_delay(watch, now))
        if not reserved and item and it.RESERVED_BY in item:
            # Another waiter has the next turn: ours comes after it, so a look
            # sooner would only load the server the holder and that waiter need.
            delay = max(delay, RESERVED_POLL * self.options.max_retry_delay * random.uniform(0.75, 1.25))
        delay *= 2 ** min(throttled, THROTTLE_DOUBLINGS)
        return self._until_takeover(delay, [(item, watch)], now, give_up_at)

    def transaction_delay(
        self,
        *,
        tries: int,
        seen: list[tuple[Mapping[str, Any] | None, Watch | None]],
        now: float,
        give_up_at: float,
        throttled: int = 0,
    ) -> float:
        """How long a multi-key acquire sleeps before its next transaction: as for one
        key, after the key held longest."""
        delay = max([backoff(self.options, tries)] + [self.hold_delay(watch, now) for _, watch in seen])
        delay *= 2 ** min(throttled, THROTTLE_DOUBLINGS)
        return self._until_takeover(delay, seen, now, give_up_at)

    def semaphore_delay(
        self,
        *,
        tries: int,
        took: float,
        error: DynLockError | None,
        seen: list[tuple[Mapping[str, Any] | None, Watch | None]],
        now: float,
        give_up_at: float,
        reserved: bool,
    ) -> float:
        """How long a waiter for a full semaphore sleeps before its next look: as for one
        key, after the slot held the shortest (the likeliest to free first), and never
        past the first slot's takeover. The waiter with a slot's next turn polls as a
        lock's does; one that finds every slot's next turn claimed, as slowly as a lock's."""
        hold = min((self.hold_delay(watch, now) for _, watch in seen if watch is not None), default=0.0)
        if reserved:
            delay = max(backoff(self.options, 0), hold)
        else:
            delay = max(backoff(self.options, tries), self.busy_server_delay(took, error), hold)
            if seen and all(item and it.RESERVED_BY in item for item, _ in seen):
                delay = max(delay, RESERVED_POLL * self.options.max_retry_delay * random.uniform(0.75, 1.25))
        return self._until_takeover(delay, seen, now, give_up_at)

    def _until_takeover(
        self,
        delay: float,
        seen: list[tuple[Mapping[str, Any] | None, Watch | None]],
        now: float,
        give_up_at: float,
    ) -> float:
        # Only a takeover still to come shortens the sleep: one that is due already
        # went into the last attempt (and, for a transaction, another key kept it
        # from applying). Never past the caller's wait.
        for item, watch in seen:
            due = self.takeover_in(item, watch, now)
            if due is not None and due > 0:
                delay = min(delay, due)
        return max(0.0, min(delay, give_up_at - now))
