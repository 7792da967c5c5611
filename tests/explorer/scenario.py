"""Schedules of lock operations in the simulated world, and the invariants checked on them.

A schedule draws a server (with or without Date headers, the item on a failed
condition and transactions), a lease length, three worker actors with their clock
skews and rates, an operator, and a program of operations at virtual times:
acquire (waiting or not), try_acquire, acquire_many, release, extend, break, crash,
cutting an actor's link. Every request of theirs meets a drawn fate (see world.py).
With ``Choices(clocks=True)`` (issue 29's world) also each actor's Date source, wall
clocks up to 60 s off, handovers, restarts after a crash and TTL deletions.

Invariants (docs/protocol.md, "What the schedule explorer checks"):

1. **Exclusion**: no two leases on a key are believed held at the same true time.
   A lease is believed held from the moment acquire returned it while its
   ``is_held`` says so, until its holder calls release(). An overlap that follows an
   operator's break is the break's (documented), not counted.
2. **Fencing**: tokens granted on a key strictly increase in the order granted.
3. **Loss is reported**: ``release()`` raises LockLost whenever the lease had ended
   before it was called (expired, broken, or another lease granted on the key).
4. **Only held leases are handed out**: what acquire returns is held at that moment.
5. **No stuck keys**: at the end, with the network healed and every live holder
   released, a key is free at once; within a lease + 3 s if a crashed actor held it,
   an undo could not reach the store, a copy of an acquire its sender never knew of
   landed, or a shared release slot was overwritten (docs/protocol.md, known limits).
"""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

from botocore.exceptions import ClientError

from django_dynlock.engine import acquiring, breaking, holding, multikey, semaphore, stamps, steps, store, waiting
from django_dynlock.engine import client as client_module
from django_dynlock.engine import clock as clock_module
from django_dynlock.engine import heartbeat as heartbeat_module
from django_dynlock.engine import lease as lease_module
from django_dynlock.engine.client import LockClient
from django_dynlock.engine.lease import Lease, LeaseGroup, Upkeep
from django_dynlock.engine.options import ClientOptions
from django_dynlock.engine.store import Store
from django_dynlock.exceptions import DynLockError, LockLost, LockNotAcquired
from localdynamo.servers import DUMMY_REGION

from .world import (
    ENDPOINT,
    T0,
    Actor,
    Choices,
    Crashed,
    SimHeartbeater,
    VirtualTime,
    VirtualUUID,
    Wire,
    World,
    WorldHedger,
)

KEYS = ["key-a", "key-b"]
RETENTION = 5.0  # with Choices(clocks=True): TTL may delete a lock item soon (the "ttl" operation)
TAKEOVER_SLACK = 3.0  # the no-stuck-keys bound: a dead holder's key is free within a lease + this
EPSILON = 1e-6

_tables = itertools.count(1)

# The modules the lock client is built from: their clocks, ids and jitter are the world's.
CLIENT_MODULES = (client_module, stamps, holding, acquiring, multikey, semaphore, breaking, steps, store, waiting)


class Violation(AssertionError):
    pass


@dataclass
class Record:
    """One lease the engine created: when, for whom, and how long its holder trusted it."""

    lease: Lease
    actor: Actor
    created: float
    history: list[tuple[float, float]] = field(default_factory=list)  # (true time, valid until in true time)
    returned: float | None = None
    ended: float | None = None

    @property
    def key(self) -> str:
        return self.lease.stored_key

    def believed(self) -> list[tuple[float, float]]:
        """The true-time intervals in which its holder, asking is_held, was told yes."""
        if self.returned is None:
            return []
        spans = []
        end = math.inf if self.ended is None else self.ended
        for i, (at, valid) in enumerate(self.history):
            following = self.history[i + 1][0] if i + 1 < len(self.history) else math.inf
            low, high = max(at, self.returned), min(valid, following, end)
            if low < high:
                spans.append((low, high))
        return spans

    def describe(self) -> str:
        return f"{self.actor.name} token {self.lease.token} on {self.key}"


class Ledger:
    """What the engine did, as seen through hooks on Lease: the material of the invariants."""

    def __init__(self, world: World):
        self.world = world
        self.records: dict[int, Record] = {}
        self.grants: list[tuple[float, str, str]] = []  # (true time, stored key, owner) of applied acquires
        self.breaks: list[tuple[float, str]] = []  # (true time, stored key) of applied breaks
        self.excused: set[str] = set()  # keys that may stay held for a while (crash, unreachable store)
        self.slots: dict[tuple[str, str], str] = {}  # (key, release slot) -> the owner tag in it
        self.violations: list[str] = []
        # Releases that returned while their lease had ended and went on in the background
        # (their retry must report the loss: the lost event), and the leases it was reported for.
        self.unreported: dict[int, tuple[Lease, str]] = {}
        self.reported: set[int] = set()
        # How near a schedule came to the bug ordered writes prevent (a guide for Hypothesis,
        # never an invariant): the owner's latest write that reached the store, by key and
        # owner (its sequence number and expiry), and how far an older write of the same
        # owner, landing after it, would move that expiry back (seconds, 0 if none did).
        self.latest: dict[tuple[str, str], tuple[int, float]] = {}
        self.rewind = 0.0
        # And how near another owner's acquire came to taking a key whose holder still trusted
        # its lease: the most the earliest reading of DynamoDB's clock it was conditioned on
        # (a takeover) passed the expiry stored for that holder (seconds; negative unless that
        # expiry was moved back, when it lets the acquire take the key), or None.
        self.stored: dict[str, tuple[str, float]] = {}  # key -> the owner and expiry its last such write stored
        self.takeover_margin: float | None = None

    def record(self, lease: Lease) -> Record | None:
        return self.records.get(id(lease))

    def created(self, lease: Lease) -> None:
        actor = self.world.actor
        assert actor is not None, "a lease created outside any actor"
        rec = Record(lease, actor, self.world.now)
        rec.history.append((self.world.now, actor.true(lease.valid_until)))
        self.records[id(lease)] = rec

    def renewed(self, lease: Lease) -> None:
        rec = self.record(lease)
        if rec is not None:
            rec.history.append((self.world.now, rec.actor.true(lease.valid_until)))

    def ended(self, lease: Lease) -> None:
        rec = self.record(lease)
        if rec is not None and rec.ended is None:
            rec.ended = self.world.now

    def applied(self, operation: str, params: dict[str, Any], outcome: Any, copy: bool) -> None:
        """A request reached the store (on time or late): note the grants and breaks it made."""
        updates = (
            [entry["Update"] for entry in params["TransactItems"]] if operation == "transact_write_items" else [params]
        )
        if operation in ("update_item", "transact_write_items"):
            self._note_order(updates, applied=not isinstance(outcome, ClientError))
        if isinstance(outcome, ClientError):
            return
        for update in updates if operation in ("update_item", "transact_write_items") else []:
            values = update.get("ExpressionAttributeValues", {})
            key = update["Key"]["key"]["S"]
            slot = update.get("ExpressionAttributeNames", {}).get("#slot")
            if slot is not None and ":tag" in values and ":base" not in values:
                tag = values[":tag"]["S"][-8:]
                if self.slots.get((key, slot), tag) != tag:
                    # Another owner's tag shared the slot and is gone: a late attempt of that
                    # owner can land again (items.RELEASE_SLOTS), held until its expiry passes.
                    self.excused.add(key)
                self.slots[key, slot] = tag
            if ":base" in values:  # an acquire: it sets the owner and steps the fence
                self.grants.append((self.world.now, key, values[":me"]["S"]))
                if copy:
                    # A copy of an acquire whose sender had a clear answer (busy) and so
                    # undid nothing: it holds the key for nobody until its expiry passes.
                    self.excused.add(key)
            elif ":why" in values:
                self.breaks.append((self.world.now, key))

    def _note_order(self, updates: list[dict[str, Any]], *, applied: bool) -> None:
        """Writes of one owner (its acquire attempts and renewals) carry a sequence number and an
        expiry: note how far one that lands after a later one would move the expiry back."""
        for update in updates:
            values = update.get("ExpressionAttributeValues", {})
            if ":seq" not in values or ":expires" not in values:
                continue
            mine = (update["Key"]["key"]["S"], values[":me"]["S"])
            seq, expires = int(values[":seq"]["N"]), float(values[":expires"]["N"])
            holder, stored = self.stored.get(mine[0], (mine[1], 0.0))
            if ":earliest" in values and holder != mine[1] and self._trusted(mine[0], holder):
                margin = float(values[":earliest"]["N"]) - stored
                self.takeover_margin = margin if self.takeover_margin is None else max(self.takeover_margin, margin)
            if applied:
                self.stored[mine[0]] = (mine[1], expires)
            seen = self.latest.get(mine)
            if seen is not None and seq < seen[0]:
                self.rewind = max(self.rewind, seen[1] - expires)
            elif applied and (seen is None or seq > seen[0]):
                self.latest[mine] = (seq, expires)

    def _trusted(self, key: str, owner: str) -> bool:
        """Whether the holder of ``owner``'s lease on ``key`` trusts it now."""
        return any(
            rec.key == key
            and rec.lease.owner == owner
            and rec.returned is not None
            and rec.ended is None
            and rec.history[-1][1] > self.world.now
            for rec in self.records.values()
        )

    def granted_at(self, rec: Record) -> float:
        """When the write that made this lease landed: its owner's last acquire on the key before it."""
        return max(
            at for at, key, owner in self.grants if key == rec.key and owner == rec.lease.owner and at <= rec.created
        )

    def _broken_between(self, one: Record, other: Record) -> bool:
        """An operator's break ends a lease at once, but its holder learns of it only at its
        next renewal: the overlap that follows is the break's, documented, not the protocol's."""
        low, high = sorted((self.granted_at(one), self.granted_at(other)))
        return any(low < at < high and key == one.key for at, key in self.breaks)

    def violate(self, text: str) -> None:
        self.violations.append(f"t={self.world.now - T0:.3f}s: {text}")

    # -- invariants ---------------------------------------------------------------------
    def check_returned(self, leases: list[Lease]) -> None:
        for lease in leases:
            rec = self.record(lease)
            assert rec is not None
            rec.returned = self.world.now
            if not lease.is_held:
                self.violate(f"acquire returned {rec.describe()}, which was no longer held (invariant 4)")

    def must_raise_on_release(self, leases: list[Lease]) -> str | None:
        """Why release() of these leases must raise LockLost now, or None."""
        for lease in leases:
            rec = self.record(lease)
            assert rec is not None
            if not lease.is_held:
                return f"{rec.describe()} had ended ({lease.state.value})"
            since = self.granted_at(rec)
            for at, key, owner in self.grants:
                if key == rec.key and owner != lease.owner and at > since:
                    return f"another owner was granted {key} at t={at - T0:.3f}s, after it"
            if any(at > since and key == rec.key for at, key in self.breaks):
                return f"{rec.key} was broken after {rec.describe()} was granted"
        return None

    def check_all(self) -> None:
        by_key: dict[str, list[Record]] = {}
        for rec in self.records.values():
            by_key.setdefault(rec.key, []).append(rec)
        for recs in by_key.values():
            # One token per acquisition: a handed-over lease's adopter has its giver's.
            firsts: dict[str, Record] = {}
            for rec in recs:
                if rec.returned is not None:
                    firsts.setdefault(rec.lease.owner, rec)
            handed = sorted(firsts.values(), key=self.granted_at)
            for earlier, later in zip(handed, handed[1:]):
                if later.lease.token <= earlier.lease.token:
                    self.violate(
                        f"token of {later.describe()} not above {earlier.describe()}, granted before it (invariant 2)"
                    )
            for one, other in itertools.combinations(recs, 2):
                # Leases of one acquisition in one process (an acquire's restamp) are one belief;
                # in two (a giver and its adopter, two adopters of one handover) they are not.
                same = one.lease.owner == other.lease.owner
                if (same and one.actor is other.actor) or self._broken_between(one, other):
                    continue
                for a_low, a_high in one.believed():
                    for b_low, b_high in other.believed():
                        overlap = min(a_high, b_high) - max(a_low, b_low)
                        if overlap > EPSILON:
                            self.violate(
                                f"{one.describe()} and {other.describe()} both believed held for {overlap:.3f}s "
                                f"from t={max(a_low, b_low) - T0:.3f}s (invariant 1)"
                            )
        for lease, why in self.unreported.values():
            rec = self.record(lease)
            assert rec is not None
            if id(lease) not in self.reported and not rec.actor.crashed:  # a dead process hears nothing
                self.violate(
                    f"release() of {rec.describe()} returned and went on in the background, but {why}, "
                    "and the retry never reported the loss (invariant 3)"
                )


@contextlib.contextmanager
def simulated(world: World, ledger: Ledger) -> Iterator[None]:
    """The engine's clocks, ids and jitter from the world; Lease transitions into the ledger."""
    vtime = VirtualTime(world)
    init, renewed, mark_lost, mark_released = Lease.__init__, Upkeep.renewed, Upkeep.mark_lost, Upkeep.mark_released

    def hooked_init(self: Lease, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        ledger.created(self)

    def hooked_renewed(self: Upkeep, *args: Any, **kwargs: Any) -> bool:
        result = renewed(self, *args, **kwargs)
        ledger.renewed(self.lease)
        return result

    def hooked_lost(self: Upkeep, *args: Any, **kwargs: Any) -> bool:
        result = mark_lost(self, *args, **kwargs)
        ledger.ended(self.lease)
        return result

    def hooked_released(self: Upkeep) -> None:
        mark_released(self)
        ledger.ended(self.lease)

    try_update = Store.try_update

    def hooked_try_update(self: Store, *args: Any, **params: Any) -> bool | None:
        done = try_update(self, *args, **params)
        if done is None:  # a best-effort write (an undo, a mark) could not reach the store
            ledger.excused.add(params["Key"]["key"]["S"] if "Key" in params else args[0])
        return done

    with contextlib.ExitStack() as stack:
        for module in (*CLIENT_MODULES, lease_module, clock_module, heartbeat_module):
            if hasattr(module, "time"):
                stack.enter_context(mock.patch.object(module, "time", vtime))
        vuuid = VirtualUUID(world)
        for module in CLIENT_MODULES:
            if hasattr(module, "uuid"):
                stack.enter_context(mock.patch.object(module, "uuid", vuuid))
            if hasattr(module, "random"):
                stack.enter_context(mock.patch.object(module, "random", world.rng))
        # Owner ids name the host and pid, and their hash picks a release slot: the same in every run.
        stack.enter_context(mock.patch("os.getpid", return_value=4242))
        stack.enter_context(mock.patch("socket.gethostname", return_value="explorer"))
        stack.enter_context(mock.patch.object(Lease, "__init__", hooked_init))
        stack.enter_context(mock.patch.object(Upkeep, "renewed", hooked_renewed))
        stack.enter_context(mock.patch.object(Upkeep, "mark_lost", hooked_lost))
        stack.enter_context(mock.patch.object(Upkeep, "mark_released", hooked_released))
        stack.enter_context(mock.patch.object(Store, "try_update", hooked_try_update))
        yield


SERVERS = {
    # name: (Date headers, the item on a failed condition, transactions)
    "dynamodb": (True, True, True),
    "dynalite": (False, False, False),
    "no-transactions": (True, True, False),
    "no-dates": (False, True, True),
}


class Scenario:
    """One schedule: drawn from ``choices``, run against ``store`` (a moto boto3 client)."""

    operations = 10  # a schedule draws 1 to this many operations

    def __init__(self, choices: Choices, store: Any):
        c = self.choices = choices
        self.server = c.one_of(list(SERVERS))
        dates, returns_item, transactions = SERVERS[self.server]
        self.lease = c.one_of([3.0, 1.5, 6.0])
        self.world = World(
            c, store, dates=dates, returns_item=returns_item, transactions=transactions, seed=c.pick(1000)
        )
        self.ledger = Ledger(self.world)
        self.world.on_apply = self.ledger.applied
        self.table = f"explore-{next(_tables)}"
        LockClient(self._options(), boto_client=store).create_table(wait=True)
        walls = [0.0, 0.8, -0.8, 45.0, -45.0] + ([60.0, -60.0, 7.0, -7.0] if c.clocks else [])
        self.actors = [
            Actor(i, name, wall_offset=c.one_of(walls), rate=c.one_of([0.0, 1e-3, -1e-3]))
            for i, name in enumerate(["A", "B", "C"])
        ]
        if c.clocks:
            for actor in self.actors:
                self._draw_date_source(actor)
        self.operator = Actor(3, "operator")
        self.handles: dict[str, list[tuple[LeaseGroup | Lease, list[Lease]]]] = {a.name: [] for a in self.actors}
        self.longest = self.lease  # the longest lease stored: a hand-over's keep may exceed the lease

    def _draw_date_source(self, actor: Actor) -> None:
        """Where the Date of an actor's replies comes from: DynamoDB's clock; DynamoDB's but for
        one reply from another clock (a front end or an intermediary that writes its own); or
        none, a proxy strips it while the others see it. (A proxy whose skewed clock writes
        every reply's Date is a known limit, docs/protocol.md: not drawn.)"""
        c = self.choices
        source = c.weighted([("true", 3), ("outlier", 3), ("stripped", 1)])
        if source == "outlier":
            # One reply, or one in every few (a fleet of front ends, one of them off).
            actor.outlier = (
                c.one_of([1, 2, 3, 5, 8, 13]),
                c.one_of([0, 3, 7]),
                c.one_of([-60.0, -5.0, -2.0, 2.0, 5.0, 60.0]),
            )
        actor.strip_date = source == "stripped"

    def _options(self) -> ClientOptions:
        return ClientOptions(
            table_name=self.table,
            endpoint_url=ENDPOINT,
            region_name=DUMMY_REGION,
            lease_duration=self.lease,
            heartbeat_period=self.lease / 3,
            # The world's network answers the boto3 client's methods (world.Wire); the
            # engine's own wire path lies below them, and tests/test_wire.py shows its
            # requests are botocore's to the byte.
            wire="boto3",
            # Hedging on (off by default), so that the world's hedger (WorldHedger) is asked:
            # it draws hedged copies when the choices say so, else sends each request once.
            hedge_after=0.025,
            # TTL may delete an item (the "ttl" operation) this long after its lease ends.
            **({"retention": RETENTION} if self.choices.clocks else {}),
        )

    def _client(self, actor: Actor) -> LockClient:
        def build() -> LockClient:
            client = LockClient(self._options(), boto_client=Wire(self.world, actor))
            client._store._hedger = WorldHedger(self.world, actor)  # type: ignore[assignment]
            client._keeper.heartbeater = SimHeartbeater(self.world, actor, client._keeper.heartbeat)  # type: ignore[assignment]
            client.add_listener(self._heard)
            return client

        actor.client = self.world.run_as(actor, build)
        return actor.client

    def _heard(self, event: str, **info: Any) -> None:
        if event == "lost" and "lease" in info:
            self.ledger.reported.add(id(info["lease"]))

    # -- running ----------------------------------------------------------------------------
    def run(self) -> Ledger:
        world, c = self.world, self.choices
        with simulated(world, self.ledger):
            for actor in [*self.actors, self.operator]:
                self._client(actor)
            at = world.now
            for _ in range(1 + c.pick(self.operations)):
                at += c.one_of([0.0, 0.1, 0.5, self.lease / 2, self.lease, 2 * self.lease])
                actor = c.one_of(self.actors)
                operation, exclusive = self._draw_operation(actor)
                world.at(at, actor, lambda a=actor, op=operation, ex=exclusive: self._perform(a, op, exclusive=ex))
            world.run_until(at)
            self._settle()
            for actor in [*self.actors, self.operator]:
                world.run_as(actor, actor.client.close)
        self.ledger.check_all()
        return self.ledger

    def _draw_operation(self, actor: Actor) -> tuple[Callable[[], None], bool]:
        c, lease = self.choices, self.lease
        kind = c.weighted(
            [
                ("acquire", 6),
                ("release", 5),
                ("try", 2),
                ("many", 2),
                ("extend", 2),
                ("break", 2),
                ("crash", 1),
                ("cut", 1),
            ]
            + ([("handover", 4), ("ttl", 2)] if c.clocks else [])
        )
        key = c.one_of(KEYS)
        wait = c.one_of([0.0, 0.3, lease + 1.0])
        pick = c.pick(3)
        new_lease = c.one_of([lease, lease / 2, lease * 2])
        cut_for = c.one_of([0.5, lease, 2 * lease])
        targeted = c.pick(2) == 0
        if kind == "handover":
            return self._draw_handover(actor, key, wait, pick), True
        if kind == "ttl":
            return self._ttl, False
        if kind == "acquire":
            return (lambda: self._acquire(actor, [key], lambda cl: cl.acquire(key, wait=wait))), True
        if kind == "try":
            return (lambda: self._acquire(actor, [key], lambda cl: cl.try_acquire(key))), True
        if kind == "many":
            return (lambda: self._acquire(actor, KEYS, lambda cl: cl.acquire_many(KEYS, wait=wait))), True
        if kind == "release":
            return (lambda: self._release(actor, pick)), True
        if kind == "extend":
            return (lambda: self._extend(actor, pick, new_lease)), True
        if kind == "break":
            return (lambda: self._break(key, targeted)), False
        if kind == "crash":
            restart = c.one_of([None, 0.5, lease, 2 * lease]) if c.clocks else None
            return (lambda: self._crash(actor, restart)), False
        return (lambda: self._cut(actor, cut_for)), False

    def _draw_handover(self, actor: Actor, key: str, wait: float, pick: int) -> Callable[[], None]:
        """A holder hands a lease to another actor (a task's enqueuer to its worker, celery.py),
        which adopts it a while later; maybe the message is delivered twice (a second adopter),
        maybe the handover is released too (a revoke) before or after the adoption, and the
        key taken anew by the giver (the task enqueued again). An actor
        that holds no lease of one key acquires ``key`` first, as an enqueuer does."""
        c, lease = self.choices, self.lease
        others = [a for a in self.actors if a is not actor]
        adopter = c.one_of(others)
        keep = c.one_of([None, lease, 2 * lease])
        delay = c.one_of([0.0, 0.1, lease / 2, lease, 2 * lease])
        twice = c.one_of([None, 0.0, 0.1, lease])
        revoke = c.one_of([None, None, 0.0, delay + 0.1, delay + lease])
        second = next(a for a in others if a is not adopter)
        return lambda: self._handover(actor, key, wait, pick, adopter, second, keep, delay, twice, revoke)

    def _perform(self, actor: Actor, operation: Callable[[], None], *, exclusive: bool) -> None:
        if not exclusive:  # things that happen to an actor, whatever it is doing
            operation()
            return
        if actor.crashed or actor.busy:
            return  # one operation at a time per actor; a crashed one does nothing
        actor.busy = True
        try:
            operation()
        except Crashed:
            pass
        finally:
            actor.busy = False

    # -- operations ---------------------------------------------------------------------------
    def _acquire(self, actor: Actor, keys: list[str], call: Callable[[LockClient], Any]) -> None:
        if any(lease.stored_key in keys for lease in actor.client.held):
            return  # its own in-process gate would make it wait for itself
        self.world.log(f"{actor.name} acquires {keys}")
        try:
            handle = call(actor.client)
        except LockNotAcquired:
            return
        except DynLockError as exc:
            self.world.log(f"{actor.name} acquire failed: {exc!r}")
            return
        if handle is None:
            return
        leases = list(handle) if isinstance(handle, LeaseGroup) else [handle]
        self.ledger.check_returned(leases)
        self.world.log(f"{actor.name} got {[(le.key, le.token) for le in leases]}")
        self.handles[actor.name].append((handle, leases))

    def _release(self, actor: Actor, pick: int) -> None:
        handles = self.handles[actor.name]
        if not handles:
            return
        handle, leases = handles.pop(pick % len(handles))
        self._release_handle(actor, handle, leases)

    def _release_handle(self, actor: Actor, handle: LeaseGroup | Lease, leases: list[Lease]) -> None:
        why = self.ledger.must_raise_on_release(leases)
        self.world.log(f"{actor.name} releases {[(le.key, le.token) for le in leases]}")
        for lease in leases:
            self.ledger.ended(lease)  # its holder's work is done: it trusts the lease no more
        try:
            handle.release()
        except LockLost as lost:
            self.world.log(f"{actor.name} release raised {lost}")
            return
        # A release that could not reach DynamoDB returns (it goes on in the background)
        # when the lease was still valid: only a break can have ended such a lease, and
        # that stays unreported (docs/protocol.md, known limits).
        unconfirmed = any(lease.upkeep.release_since is not None for lease in leases)
        if why is not None and not unconfirmed:
            self.ledger.violate(f"release() of {actor.name}'s lease returned normally, but {why} (invariant 3)")
        if why is not None and unconfirmed:
            # Its background retry must tell the holder (the lost event, lock_lost, a WARNING).
            for lease in leases:
                if lease.upkeep.release_since is not None:
                    self.ledger.unreported[id(lease)] = (lease, why)

    def _handover(
        self,
        actor: Actor,
        key: str,
        wait: float,
        pick: int,
        adopter: Actor,
        second: Actor,
        keep: float | None,
        delay: float,
        twice: float | None,
        revoke: float | None,
    ) -> None:
        handles = [(h, leases) for h, leases in self.handles[actor.name] if isinstance(h, Lease)]
        if not handles:
            self._acquire(actor, [key], lambda cl: cl.acquire(key, wait=wait))
            handles = [(h, leases) for h, leases in self.handles[actor.name] if isinstance(h, Lease)]
        if not handles:
            return
        handle, leases = handles[pick % len(handles)]
        lease = leases[0]
        if lease.upkeep.renew_lock.locked():
            return  # its heartbeat is renewing it right now, further up the stack
        self.world.log(f"{actor.name} hands over {(lease.key, lease.token)} (keep {keep})")
        self.longest = max(self.longest, keep or 0.0)
        try:
            handover = lease.hand_over(keep)  # the giver's belief ends here (Upkeep.mark_released)
        except DynLockError as exc:
            self.world.log(f"{actor.name} hand_over failed: {exc!r}")
            return  # still its holder's to release (a lost one too: its release write clears the key)
        self.handles[actor.name].remove((handle, leases))
        # Until adopted, nobody renews it: a dead holder's lease, taken over after its expiry
        # (or by a waiter that watches it, where no expiry is stored).
        self.ledger.excused.add(lease.stored_key)
        now = self.world.now
        for who, after in [(adopter, delay), (second, None if twice is None else delay + twice)]:
            if after is not None:
                self.world.at(
                    now + after,
                    who,
                    lambda w=who: self._perform(w, lambda: self._adopt(w, handover), exclusive=True),
                )
        if revoke is not None:
            self.world.at(
                now + revoke, actor, lambda: self._perform(actor, lambda: self._revoke(actor, handover), exclusive=True)
            )

    def _adopt(self, actor: Actor, handover: Any) -> None:
        if self.world.healed:
            return  # the end: this task never runs (its lease runs out, ledger.excused)
        if any(held.key == handover.key for held in actor.client.held):
            return  # its own in-process gate would refuse it
        self.world.log(f"{actor.name} adopts {(handover.key, handover.token)}")
        try:
            lease = actor.client.adopt(handover)
        except DynLockError as exc:
            self.world.log(f"{actor.name} adopt failed: {exc!r}")
            return
        self.ledger.check_returned([lease])
        self.world.log(f"{actor.name} adopted {(lease.key, lease.token)}")
        self.handles[actor.name].append((lease, [lease]))

    def _revoke(self, actor: Actor, handover: Any) -> None:
        if self.world.healed:
            return  # the end: nothing is revoked (or enqueued anew) once holders are released
        self.world.log(f"{actor.name} releases the handover of {(handover.key, handover.token)}")
        try:
            done = actor.client.release_handover(handover)
        except DynLockError as exc:
            self.world.log(f"{actor.name} release_handover failed: {exc!r}")
            return
        self.world.log(f"release_handover: {done}")
        if done:
            # The task will not run, so it may be sent again: the next enqueue takes the key
            # (a QueueOnce task revoked, then queued anew), which the adopter must not hold.
            self._acquire(actor, [handover.key], lambda cl: cl.try_acquire(handover.key))

    def _ttl(self) -> None:
        """DynamoDB's TTL deletes the lock items whose time to live has passed (by its clock).
        Not drawn where any client cannot learn that clock: such a client starts a new fencing
        counter from its wall clock (docs/protocol.md, known limits)."""
        if not self.world.dates or any(actor.strip_date for actor in self.actors):
            return
        ttl = self._options().ttl_attribute
        for item in self.world.store.scan(TableName=self.table, ConsistentRead=True)["Items"]:
            if ttl in item and float(item[ttl]["N"]) < self.world.now:
                self.world.log(f"TTL deletes {item['key']['S']}")
                self.world.store.delete_item(TableName=self.table, Key={"key": item["key"]})
                # A late attempt of an earlier owner may land on the fresh key: a ghost holder.
                self.ledger.excused.add(item["key"]["S"])

    def _extend(self, actor: Actor, pick: int, new_lease: float) -> None:
        handles = self.handles[actor.name]
        if not handles:
            return
        handle, leases = handles[pick % len(handles)]
        if any(lease.upkeep.renew_lock.locked() for lease in leases):
            return  # its heartbeat is renewing it right now, further up the stack
        try:
            handle.extend(new_lease)
        except DynLockError:
            pass

    def _break(self, key: str, targeted: bool) -> None:
        token = None
        if targeted:
            granted = [r for r in self.ledger.records.values() if r.key == key and r.returned is not None]
            if not granted:
                return
            token = max(granted, key=lambda r: r.created).lease.token
        operator = self.operator

        def attempt() -> None:
            try:
                broken = operator.client.break_lease(key, token=token, reason="explorer")
            except DynLockError:
                return  # the ledger counts it if and when it lands
            self.world.log(f"break {key} token={token}: {broken}")

        self.world.run_as(operator, attempt)

    def _crash(self, actor: Actor, restart: float | None = None) -> None:
        if actor.crashed:
            return
        self.world.log(f"{actor.name} crashes")
        actor.crashed = True
        for key in [key for key, (lease, _) in self.ledger.unreported.items() if self._record(lease).actor is actor]:
            del self.ledger.unreported[key]  # a dead process hears nothing
        if restart is not None:
            self.world.at(self.world.now + restart, None, lambda: self._restart(actor))
        for lease in actor.client.held:
            self.ledger.ended(lease)  # a dead process trusts nothing
        for _, leases in self.handles[actor.name]:
            for lease in leases:
                self.ledger.ended(lease)
        # It may have held a key, left a write in flight, a reservation, a release to retry.
        self.ledger.excused.update(KEYS)

    def _record(self, lease: Lease) -> Record:
        rec = self.ledger.record(lease)
        assert rec is not None
        return rec

    def _restart(self, actor: Actor) -> None:
        """A new process on the crashed one's host (its clocks and proxy): a fresh client,
        which has yet to learn DynamoDB's clock. Nothing of the old one runs on."""
        if self.world.healed:
            return
        self.world.log(f"{actor.name} restarts")
        actor.client._heartbeater.stop()
        actor.generation += 1
        actor.crashed = actor.busy = False
        actor.dated = 0
        self.handles[actor.name] = []
        self._client(actor)

    def _cut(self, actor: Actor, seconds: float) -> None:
        self.world.log(f"{actor.name} cut off for {seconds}s")
        actor.cut_until = self.world.now + seconds

    # -- the end: heal, release, and every key must come free -------------------------------------------
    def _settle(self) -> None:
        world, ledger = self.world, self.ledger
        world.run_until(world.now + 2 * self.lease)  # operations still running finish
        world.healed = True
        for actor in self.actors:
            if actor.crashed:
                continue
            actor.cut_until = -math.inf
            for handle, leases in self.handles[actor.name]:
                world.run_as(actor, lambda: self._release_handle(actor, handle, leases))  # noqa: B023 (called in this iteration)
            self.handles[actor.name] = []
        # Requests still in the network land; release retries and lapsing reservations run out.
        world.run_until(world.now + 16 * self.lease)
        checker = Actor(4, "checker")
        self._client(checker)
        for key in KEYS:
            excused = key in ledger.excused
            wait = self.longest + TAKEOVER_SLACK if excused else 0.0
            started = world.now
            try:
                lease = world.run_as(checker, lambda: checker.client.acquire(key, wait=wait))  # noqa: B023 (called in this iteration)
            except LockNotAcquired as busy:
                ledger.violate(
                    f"{key} still held {world.now - started:.2f}s into the final check "
                    f"({'bound: lease + 3 s' if excused else 'nobody holds it'}): {busy.holder!r} (invariant 5)"
                )
                continue
            world.run_as(checker, lease.release)
        world.run_as(checker, checker.client.close)
