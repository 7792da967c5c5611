"""Lease handles: what a successful acquire returns to its holder.

A :class:`Lease` decides locally, without the network, whether its holder may still
act: until ``send time of the last successful write + lease - safety margin`` on
this process' monotonic clock, and never past the moment DynamoDB's clock could
reach the expiry that write stored. Takers need that expiry to be past by the
earliest DynamoDB's clock can read (or, as a fallback, to have watched the record
unchanged for a full lease on their own monotonic clock); so with clocks that run at
the same rate the two intervals never overlap, whatever the wall clocks say.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, Self

from ..exceptions import DynLockError, InvalidArgument, LockLost
from .clock import monotonic
from .items import LeaseInfo
from .observe import metrics_name as metrics_name_of

if TYPE_CHECKING:
    from .options import ClientOptions

logger = logging.getLogger("django_dynlock")

__all__ = ["Handover", "Lease", "LeaseClient", "LeaseGroup", "LeaseInfo", "LeaseKeeper", "LeaseState", "Upkeep"]


@dataclass(frozen=True)
class Handover:
    """A lease on its way to another process: its key, owner id, token and the
    sequence number of its last write. ``as_dict()``/``from_dict()`` carry it in a
    message (all values strings, so any serializer keeps them exact)."""

    key: str
    owner: str
    token: int
    seq: int

    def as_dict(self) -> dict[str, str]:
        return {"key": self.key, "owner": self.owner, "token": str(self.token), "seq": str(self.seq)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Handover:
        """The Handover of ``as_dict()``; InvalidArgument if ``data`` is not one."""
        try:
            key, owner = data["key"], data["owner"]
            token, seq = int(data["token"]), int(data["seq"])
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidArgument(f"not a lease handover: {data!r}") from exc
        if not (isinstance(key, str) and key and isinstance(owner, str) and owner) or seq < 1:
            raise InvalidArgument(f"not a lease handover: {data!r}")
        return cls(key=key, owner=owner, token=token, seq=seq)


class LeaseClient(Protocol):
    """What a lease knows of the client that holds it: its options, and a look at a key."""

    options: ClientOptions

    def get(self, key: str, *, include_released: bool = False) -> LeaseInfo | None: ...


class LeaseKeeper(Protocol):
    """Who keeps a lease while it is held (holding.Keeper): its writes go through it."""

    def extend(self, lease: Lease, lease_seconds: float | None) -> None: ...

    def keep_for(self, lease: Lease, seconds: float) -> None: ...

    def hand_over(self, lease: Lease, keep: float | None) -> Handover: ...

    def release(self, lease: Lease) -> None: ...


class LeaseState(str, enum.Enum):  # noqa: UP042 (str(state) stays "LeaseState.HELD")
    """Where a :class:`Lease` stands, as its holder sees it (``lease.state``)."""

    #: Held, and renewed in the background.
    HELD = "held"
    #: A renewal failed; the lease is still valid for ``remaining()`` and renewals go on.
    AT_RISK = "at_risk"
    #: Ended before its release: expired, taken over, broken (``lost_reason`` says which).
    LOST = "lost"
    #: Released by its holder.
    RELEASED = "released"


class _ReleasedOnExit:
    """``with handle:`` releases on exit, and never hides the protected code's own exception."""

    def release(self) -> None:
        """Release what this handle holds (each kind of handle says how)."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        release_quietly_if_failing(self, exc)


def release_quietly_if_failing(handle: _ReleasedOnExit, exc: BaseException | None) -> None:
    """Release on context exit without ever hiding the protected code's own exception."""
    if exc is None:
        handle.release()
        return
    try:
        handle.release()
    except DynLockError as release_error:
        # The caller's exception is what they need to see; ours is logged beside it.
        logger.warning("while handling %r, releasing %r also failed: %s", exc, handle, release_error)


class Lease(_ReleasedOnExit):
    """A held lock on one key. Use as a context manager, or call :meth:`release`.

    Returned by :meth:`LockClient.acquire` and its kin; not built by hand. While it is
    held, the client's heartbeat thread renews it. :attr:`is_held`, :meth:`remaining`
    and :meth:`raise_if_lost` are local checks (no network); :meth:`extend`,
    :meth:`keep_for`, :meth:`hand_over`, :meth:`release` and :meth:`info` send a request.
    """

    def __init__(
        self,
        client: LeaseClient,
        *,
        keeper: LeaseKeeper,
        key: str,
        stored_key: str,
        owner: str,
        token: int,
        lease_seconds: float,
        sent_at: float,
        ends_at: float | None = None,
        seq: int = 1,
        holder: dict[str, Any] | None = None,
        metrics_name: str | None = None,
    ):
        self._client = client
        self._keeper = keeper
        #: The lock key, as given (without the alias' ``KEY_PREFIX``).
        self.key = key
        #: The key as stored in the table (with ``KEY_PREFIX``).
        self.stored_key = stored_key
        #: This acquisition's owner id: a new one for each acquisition, never reused.
        self.owner = owner
        #: The fencing token: greater than every token issued before for this key.
        self.token = token
        #: The holder metadata stored with the lease (a dict of strings).
        self.holder = dict(holder or {})
        #: The ``name`` label of its metrics and spans: the key template, ``metrics_name=``,
        #: or the key's prefix (docs/observability.md). Never the key itself.
        self.metrics_name = metrics_name_of(key, metrics_name)
        #: A semaphore's slot this lease holds (0 to its limit - 1); 0 for a lock.
        self.slot = 0
        self.acquired_monotonic = sent_at
        self.lease_seconds = lease_seconds
        #: The lock client's side of this lease (not for holders): see :class:`Upkeep`.
        self.upkeep = Upkeep(self, seq)
        self.upkeep.renewed(sent_at, lease_seconds, ends_at)

    @property
    def client(self) -> LeaseClient:
        """The client that holds this lease."""
        return self._client

    # -- local view, no network ------------------------------------------------
    @property
    def valid_until(self) -> float:
        """The monotonic time (``monotonic()``) at which this holder must stop."""
        return self.upkeep.valid_until

    @property
    def state(self) -> LeaseState:
        """:class:`LeaseState` now: ``LOST`` as soon as the validity has run out, renewal or not."""
        upkeep = self.upkeep
        state = upkeep.state
        if state in (LeaseState.HELD, LeaseState.AT_RISK) and monotonic() >= upkeep.valid_until:
            return LeaseState.LOST
        return state

    @property
    def is_held(self) -> bool:
        """True while this holder may act. A local check: it sends nothing."""
        return self.state in (LeaseState.HELD, LeaseState.AT_RISK)

    def remaining(self) -> float:
        """Seconds this holder may still act (0.0 once lost or released)."""
        if not self.is_held:
            return 0.0
        return max(0.0, self.upkeep.valid_until - monotonic())

    def raise_if_lost(self) -> None:
        """Raise :class:`LockLost` unless this holder may still act. Call it before a side effect."""
        state = self.state
        if state in (LeaseState.HELD, LeaseState.AT_RISK):
            return
        if state is LeaseState.RELEASED:
            raise LockLost(self.key, self.token, "released", "the lease was released")
        raise self.upkeep.lost or LockLost(self.key, self.token, "expired", "no successful renewal within the lease")

    @property
    def needs_renewal(self) -> bool:
        return self.upkeep.state in (LeaseState.HELD, LeaseState.AT_RISK)

    @property
    def needs_heartbeat(self) -> bool:
        """Whether the heartbeat thread still has work for it: a renewal or a release retry."""
        return self.needs_renewal or self.upkeep.release_pending

    @property
    def lost_reason(self) -> str | None:
        """Why the lease was lost (``"expired"``, ``"taken"``, ``"broken"``, ``"released"``,
        ``"closed"``, ``"fork"``), or None while it is not lost."""
        if self.state is not LeaseState.LOST:
            return None
        lost = self.upkeep.lost
        return lost.reason if lost else "expired"

    # -- network operations ------------------------------------------------------
    def extend(self, lease: float | None = None) -> None:
        """Renew now, optionally with a new duration: one conditional write."""
        self._keeper.extend(self, lease)

    def keep_for(self, seconds: float) -> None:
        """Stop renewing, and leave the lock held for ``seconds`` more (one write).

        For cron-style singletons: after a fast run on one host, the other hosts'
        runs of the same schedule still find the key busy. Any acquire takes it once
        its stored expiry has passed by DynamoDB's clock.
        """
        self._keeper.keep_for(self, seconds)

    def hand_over(self, keep: float | None = None) -> Handover:
        """Stop renewing and releasing this lease here, and return what another process
        needs to continue it (``client.adopt``) or end it (``client.release_handover``).

        With ``keep``, first restamp the expiry ``keep`` seconds ahead (one write): the
        lease must outlast the time until the other process takes it on (a queued
        task). Without, no write: it ends at the expiry of its last write. Until then
        nobody can take the key but the receiver; after, anyone.
        """
        return self._keeper.hand_over(self, keep)

    def release(self) -> None:
        """Release the lock (one conditional write).

        Raises :class:`LockLost` if the lease had already ended (expired, taken over
        or broken): the protected work may have overlapped another holder.
        """
        self._keeper.release(self)

    def condition_check(self) -> dict[str, Any]:
        """A ``TransactWriteItems`` entry that fails unless this lease still holds its key.

        Put it beside your own writes to DynamoDB data so they apply only while the
        lease is ours: ``TransactItems=[lease.condition_check(), {"Put": ...}]``.
        """
        options = self._client.options
        return {
            "ConditionCheck": {
                "TableName": options.table_name,
                "Key": {options.key_attribute: {"S": self.stored_key}},
                # The owner id names this acquisition alone (see docs/protocol.md).
                "ConditionExpression": "#owner = :me",
                "ExpressionAttributeNames": {"#owner": "owner"},
                "ExpressionAttributeValues": {":me": {"S": self.owner}},
            }
        }

    def info(self) -> LeaseInfo | None:
        """The table's current view of this key (one consistent read)."""
        return self._client.get(self.key)

    def __repr__(self) -> str:
        return f"<Lease key={self.key!r} token={self.token} state={self.state.value} remaining={self.remaining():.2f}s>"


class Upkeep:
    """The lock client's side of one lease: its bookkeeping, and the state changes only
    the client and its heartbeat thread make. Holders use :class:`Lease`'s methods."""

    def __init__(self, lease: Lease, seq: int):
        self.lease = lease
        # The sequence number of our last write to the item (see items.SEQ).
        self.seq = seq
        # Renewals of one lease are serialised, so the last one sent is the last applied
        # and its send time bounds our validity.
        self.renew_lock = threading.Lock()
        # A release that could not reach DynamoDB, retried by the heartbeat thread.
        self.release_pending = False
        self.release_since: float | None = None
        self.release_tries = 0
        # Whether the client has made sure no late write of ours holds the key (Keeper.disown).
        self.disowned = False
        # When the heartbeat thread is next due for this lease (older heap entries are stale).
        self.heartbeat_due = 0.0
        # The validity end an alarm already watches (Keeper._lose_on_time): one alarm per end.
        self.watched_end: float | None = None
        # How many looks at the key (writes, reads, transactions) its acquisition took: DEBUG's line.
        self.looks = 0
        # When (monotonic) the renewal in flight was sent, and how long the last applied one
        # took: so that a lease that ran out says whether DynamoDB was slow or this process was.
        self.renewal_sent: float | None = None
        self.last_renewal_took: float | None = None
        # The state as last set, and until when (monotonic) the holder may act, under this lock.
        self.lock = threading.Lock()
        self._state = LeaseState.HELD
        self._lost: LockLost | None = None
        self.valid_until = 0.0

    @property
    def state(self) -> LeaseState:
        """The state as last set, before the clock is consulted (``Lease.state`` does that)."""
        return self._state

    @property
    def lost(self) -> LockLost | None:
        """Why the lease was lost, as the error its holder gets."""
        return self._lost

    def renewed(self, sent_at: float, lease_seconds: float, ends_at: float | None = None) -> bool:
        """Record a successful write sent at ``sent_at``; True if the lease was at risk.

        ``ends_at`` (monotonic) is when takers may start to take the key over, by what
        the write stored and what we know of DynamoDB's clock; without it, a lease
        after the send.
        """
        margin = lease_seconds * self.lease.client.options.safety_margin
        end = sent_at + lease_seconds if ends_at is None else min(ends_at, sent_at + lease_seconds)
        with self.lock:
            self.lease.lease_seconds = lease_seconds
            # Not max(): a shorter extend() shortens what waiters will wait for too.
            self.valid_until = end - margin
            if self._state is LeaseState.AT_RISK:
                self._state = LeaseState.HELD
                return True
        return False

    def mark_at_risk(self) -> bool:
        with self.lock:
            if self._state is LeaseState.HELD:
                self._state = LeaseState.AT_RISK
                return True
        return False

    def mark_lost(self, reason: str, detail: str = "") -> bool:
        """Lost from now on; False if it had ended already (lost or released)."""
        with self.lock:
            if self._state in (LeaseState.LOST, LeaseState.RELEASED):
                return False
            self._state = LeaseState.LOST
            self._lost = LockLost(self.lease.key, self.lease.token, reason, detail)
        return True

    def mark_released(self) -> None:
        with self.lock:
            self._state = LeaseState.RELEASED

    def after_fork(self) -> None:
        """In a forked child: new locks (a thread of the parent may have held the old ones at fork)."""
        self.lock = threading.Lock()
        self.renew_lock = threading.Lock()


class LeaseGroup(_ReleasedOnExit):
    """Several leases acquired together by ``acquire_many``; one handle releases all.

    ``group[key]`` is the :class:`Lease` of one key; iterating gives every lease. Use it
    as a context manager, or call :meth:`release`.
    """

    def __init__(self, client: LeaseClient, leases: list[Lease]):
        self._client = client
        #: The leases, one per key, in the order the keys were given.
        self.leases = leases

    @property
    def keys(self) -> list[str]:
        """The keys, in the order they were given."""
        return [lease.key for lease in self.leases]

    @property
    def tokens(self) -> dict[str, int]:
        """Each key's fencing token."""
        return {lease.key: lease.token for lease in self.leases}

    def __getitem__(self, key: str) -> Lease:
        """The lease of ``key`` (KeyError if the group has none)."""
        for lease in self.leases:
            if lease.key == key:
                return lease
        raise KeyError(key)

    def __iter__(self) -> Iterator[Lease]:
        return iter(self.leases)

    def __len__(self) -> int:
        return len(self.leases)

    @property
    def is_held(self) -> bool:
        """True while every lease of the group may still act (local check)."""
        return all(lease.is_held for lease in self.leases)

    def remaining(self) -> float:
        """Seconds the group may still act: the least of its leases' (local check)."""
        return min((lease.remaining() for lease in self.leases), default=0.0)

    def raise_if_lost(self) -> None:
        """Raise :class:`LockLost` for the first lease that may no longer act."""
        for lease in self.leases:
            lease.raise_if_lost()

    def extend(self, lease: float | None = None) -> None:
        """Renew every lease now, optionally with a new duration (one write per key)."""
        for one in self.leases:
            one.extend(lease)

    def release(self) -> None:
        """Release every lease; raise the first LockLost after trying them all."""
        first: LockLost | None = None
        for lease in reversed(self.leases):
            try:
                lease.release()
            except LockLost as error:
                first = first or error
        if first is not None:
            raise first

    def __repr__(self) -> str:
        return f"<LeaseGroup {self.tokens}>"
