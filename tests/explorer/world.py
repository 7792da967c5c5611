"""A simulated world under the lock engine: virtual time, a faulty network, skewed clocks.

Everything runs in one thread, in virtual time, so a schedule replays exactly:

- **Time.** The engine's ``time`` module is replaced by :class:`VirtualTime`. Each
  actor (one LockClient, as one process) has its own monotonic clock, running a
  little fast or slow, and its own wall clock, which may be far off. ``sleep()``
  runs whatever falls due meanwhile: heartbeats, requests landing late, other
  actors' operations. An operation that starts inside another's sleep runs to its
  end first, and the sleeper wakes late: a thread that was not scheduled for a
  while, which is a schedule real threads can have too.
- **Network.** Each actor's boto3 client is a :class:`Wire` to one real in-process
  moto client. Every request meets a fate drawn from the schedule: delivered;
  held in the network and delivered later (or never) while the sender times out;
  (with ``Choices(ambush=True)``) held, or applied and a copy held, until just before
  another actor's takeover of the same key that it can affect;
  applied with its reply lost; applied and delivered again later; refused; an HTTP
  500 before or after it was applied; throttled. An actor's link can be cut.
- **DynamoDB's clock.** Replies carry a ``Date`` header from the server's own
  clock (or none, like dynalite), one-second resolution as on the wire; with
  ``Choices(clocks=True)``, what reaches an actor may have passed a proxy that strips it
  or front ends whose clock is off for a lone reply (``Actor.strip_date``, ``outlier``).
- **Heartbeats** are events of the world instead of a thread (:class:`SimHeartbeater`).

What is drawn comes from a :class:`Choices`: Hypothesis while exploring, a recorded
list when a counterexample is replayed as a regression test.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
import uuid
from collections.abc import Callable
from copy import deepcopy as _deepcopy
from email.utils import formatdate
from typing import Any

from botocore.exceptions import ClientError, EndpointConnectionError, ReadTimeoutError

T0 = 1_800_000_000.0  # the world's true time at the start (epoch seconds)
ENDPOINT = "http://explorer.invalid"
# A delay of a request held in the network: until just before another actor's write on the
# same key that it can still affect, a takeover conditioned on DynamoDB's clock having passed
# the expiry the held write sets. The worst moment for a stale write of a holder (a renewal,
# a copy of its acquire) to land: it would move the expiry back right before a waiter's takeover.
RIVAL = "rival"
WRITES = ("update_item", "transact_write_items", "put_item", "delete_item")
MAX_STEPS = 40_000  # events, sleeps and requests in one schedule: more means a loop that does not wait


class Crashed(BaseException):
    """Raised inside a crashed actor: its process is gone, nothing of it runs on."""


class RunawaySchedule(AssertionError):
    """The engine kept working without letting time pass (a loop without a sleep)."""


class Choices:
    """Where a schedule's decisions come from. 0 is always the most ordinary choice,
    so that Hypothesis, shrinking towards 0, shrinks towards a schedule without faults."""

    def __init__(
        self,
        data: Any = None,
        replay: list[int] | None = None,
        *,
        ambush: bool = False,
        clocks: bool = False,
        hedge: bool = False,
    ):
        self._data = data
        self._replay = list(replay or [])
        self.log: list[int] = []
        # Whether the schedule draws issue 29's world (scenario.py): each actor's own Date
        # source (the true clock, a lone outlier, none) and wall clocks up to 60 s off, and
        # handovers. Off by default, so that the seeds and replays recorded before it keep
        # their schedules.
        self.clocks = clocks
        # Whether a request held in the network may wait for another actor's takeover of the
        # same key and land just before it (World.AMBUSH, RIVAL): the search for the reverted
        # ordered writes and its replays. Off by default, so that every other search, replay
        # and seed draws the schedules it always drew.
        self.ambush = ambush
        # Whether a request the engine would hedge (engine/hedging.py) may be late and get a
        # second copy (World.hedged). Off by default, for the same reason.
        self.hedge = hedge

    def pick(self, n: int) -> int:
        if n <= 1:
            return 0
        if self._data is not None:
            from hypothesis import strategies as st

            value = self._data.draw(st.integers(0, n - 1))
        else:
            at = len(self.log)
            value = min(self._replay[at], n - 1) if at < len(self._replay) else 0
        self.log.append(value)
        return value

    def weighted(self, options: list[tuple[Any, int]]) -> Any:
        """One of ``options`` ((value, weight) pairs, the first the ordinary one)."""
        roll = self.pick(sum(weight for _, weight in options))
        for value, weight in options:
            if roll < weight:
                return value
            roll -= weight
        raise AssertionError("unreachable")

    def one_of(self, values: list[Any]) -> Any:
        return values[self.pick(len(values))]


class SeededChoices(Choices):
    """Choices from a seeded random stream: a sweep over seeds, and the counterexamples it found.

    A seed names the same schedule as long as the engine sends the same requests;
    a change that adds or removes one shifts the stream after it (so do recorded lists).
    """

    def __init__(self, seed: int, *, clocks: bool = False, hedge: bool = False):
        super().__init__(clocks=clocks, hedge=hedge)
        self._random = random.Random(seed)

    def pick(self, n: int) -> int:
        value = self._random.randrange(n) if n > 1 else 0
        self.log.append(value)
        return value


class Actor:
    """One process with a lock client: its clocks, and whether it is still alive."""

    def __init__(self, index: int, name: str, *, wall_offset: float = 0.0, rate: float = 0.0):
        self.name = name
        self.wall_offset = wall_offset
        self.rate = rate  # how much faster than true time its clocks run
        self.mono_base = 1000.0 * (index + 1)
        self.crashed = False
        self.generation = 0  # its process, counted up when a crashed one restarts (scenario.py)
        self.busy = False  # an operation of its own is running (one at a time per actor)
        self.cut_until = -math.inf
        self.client: Any = None
        # Its Date source (Choices(clocks=True)): whether a proxy strips the Date from its
        # replies; how far a proxy's clock that writes the Date of all its replies is off
        # (whole seconds); and lone outliers: (the first of its dated replies dated off, then
        # every how many, 0 for that one only; how far off).
        self.strip_date = False
        self.date_skew = 0.0
        self.outlier: tuple[int, int, float] | None = None
        self.dated = 0  # its replies that carried a Date

    def mono(self, t: float) -> float:
        return self.mono_base + (t - T0) * (1.0 + self.rate)

    def true(self, mono: float) -> float:
        return T0 + (mono - self.mono_base) / (1.0 + self.rate)

    def when(self, mono: float) -> float:
        """The first true time at which this actor's clock reads ``mono`` or more: when a
        thread waiting until ``mono`` wakes. ``true(mono)`` may read a few ulps below it
        on a skewed clock, where a wait for ``mono`` would not have ended yet."""
        at = self.true(mono)
        while self.mono(at) < mono:
            at = math.nextafter(at, math.inf)
        return at

    def wall(self, t: float) -> float:
        return t + self.wall_offset + (t - T0) * self.rate

    def __repr__(self) -> str:
        return f"<Actor {self.name}>"


class World:
    """Virtual time, the event queue, and the network to one real store."""

    def __init__(
        self,
        choices: Choices,
        store: Any,
        *,
        dates: bool = True,
        returns_item: bool = True,
        transactions: bool = True,
        seed: int = 0,
    ):
        self.choices = choices
        self.store = store  # a real boto3 DynamoDB client (moto in-process)
        self.dates = dates
        self.returns_item = returns_item
        self.transactions = transactions
        self.rng = random.Random(seed)
        self.now = T0
        self.actor: Actor | None = None
        self.healed = False  # from the final phase on: no faults, nothing held back
        self.steps = 0
        self._queue: list[tuple[float, int, Actor | None, Callable[[], None]]] = []
        # Requests held for another actor's takeover (RIVAL): their sender, the expiry they
        # set by key, and how they land.
        self._ambushes: list[tuple[Actor, dict[str, float], Callable[[], None]]] = []
        self._order = itertools.count()
        self._ids = random.Random(seed + 1)  # owner ids: unique, and the same on every replay
        self.trace: list[str] = []
        # Rewrites every request before it is sent: how a test reverts a fix at the wire.
        self.rewrite: Callable[[str, dict[str, Any]], dict[str, Any]] | None = None
        # Told of every request that reaches the store, with what the store made of it, and
        # whether it was a copy its sender never heard of (its sender had its reply already).
        self.on_apply: Callable[[str, dict[str, Any], Any, bool], None] | None = None

    # -- time and events ---------------------------------------------------------------
    def _step(self) -> None:
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise RunawaySchedule(f"more than {MAX_STEPS} events, sleeps and requests at t={self.now - T0:.3f}s")

    def at(self, when: float, actor: Actor | None, fn: Callable[[], None]) -> None:
        heapq.heappush(self._queue, (max(when, self.now), next(self._order), actor, fn))

    def run_until(self, target: float) -> None:
        while self._queue and self._queue[0][0] <= target:
            due, _, actor, fn = heapq.heappop(self._queue)
            self.now = max(self.now, due)
            self._step()
            self.run_as(actor, fn)
        self.now = max(self.now, target)

    def run_as(self, actor: Actor | None, fn: Callable[[], Any]) -> Any:
        previous, self.actor = self.actor, actor
        try:
            return fn()
        finally:
            self.actor = previous

    def sleep(self, seconds: float) -> None:
        self._step()
        rate = self.actor.rate if self.actor else 0.0
        generation = self.actor.generation if self.actor else 0
        self.run_until(self.now + max(0.0, seconds) / (1.0 + rate))
        if self.actor is not None and (self.actor.crashed or self.actor.generation != generation):
            raise Crashed(self.actor.name)  # its process crashed meanwhile (and maybe a new one started)

    def log(self, text: str) -> None:
        self.trace.append(f"{self.now - T0:8.3f} {text}")

    def new_uuid(self) -> uuid.UUID:
        return uuid.UUID(int=self._ids.getrandbits(128))

    # -- the network ----------------------------------------------------------------------
    FATES = [
        ("ok", 70),
        ("held", 6),
        ("reply_lost", 6),
        ("duplicate", 4),
        ("refused", 4),
        ("500_applied", 4),
        ("500", 3),
        ("throttled", 3),
    ]
    # Drawn only with Choices(ambush=True), after the others so that a recorded choice
    # below 100 keeps its fate: applied, and a copy held in the network until just before
    # another actor's takeover of the key that it can affect (RIVAL).
    AMBUSH = [("echo", 10)]

    def request(self, actor: Actor, operation: str, params: dict[str, Any]) -> dict[str, Any]:
        self._step()
        if actor.crashed:
            raise Crashed(actor.name)
        if self.rewrite is not None:
            params = self.rewrite(operation, params)
        api = self.store.meta.method_to_api_mapping[operation]
        if operation == "transact_write_items" and not self.transactions:
            self.sleep(0.002)
            raise self._error(api, "UnknownOperationException", 400, actor)
        if operation in WRITES:
            self._spring(actor, params)
        if self.healed:
            fate = "ok"
        elif self.now < actor.cut_until:
            fate = "cut"
        else:
            fate = self.choices.weighted(self.FATES + self.AMBUSH if self.choices.ambush else self.FATES)
        there = self.choices.one_of([0.002, 0.02, 0.2]) if fate != "refused" else 0.001
        timeout = self.choices.one_of([2.0, 0.3])  # botocore's read timeout, ours or a shorter one
        self.log(f"{actor.name} {api} {fate}")
        if fate in ("held", "cut", "duplicate"):
            # Delivered later (or never); the sender sees a timeout, or (a duplicate) its reply.
            delays: list[float | str | None] = [None, 0.05, 0.5, 1.5, 4.0, 8.0]
            later = self.choices.one_of(delays + [RIVAL] if self.choices.ambush else delays) if fate != "cut" else None
            if fate == "cut" and self.choices.pick(2):
                later = self.choices.one_of([0.05, 1.5, 4.0])
            if later is not None:
                self._hold(actor, api, operation, params, later, copy=fate == "duplicate")
            if fate != "duplicate":
                self.sleep(timeout)
                raise ReadTimeoutError(endpoint_url=ENDPOINT)
        if fate == "echo":
            self._hold(actor, api, operation, params, RIVAL, copy=True)
        if fate == "refused":
            self.sleep(there)
            raise EndpointConnectionError(endpoint_url=ENDPOINT)
        if fate == "throttled":
            self.sleep(there)
            raise self._error(api, "ProvisionedThroughputExceededException", 400, actor)
        if fate == "500":
            self.sleep(there)
            raise self._error(api, "InternalServerError", 500, actor)
        self.sleep(there)
        if actor.crashed:
            raise Crashed(actor.name)
        # A lost reply's Date reaches nobody (and counts for no outlier, see _date_header).
        outcome = self._apply(operation, params, to=None if fate in ("reply_lost", "500_applied") else actor)
        if fate == "reply_lost":
            self.sleep(timeout)
            raise ReadTimeoutError(endpoint_url=ENDPOINT)
        if fate == "500_applied":
            self.sleep(self.choices.one_of([0.002, 0.2]))
            raise self._error(api, "InternalServerError", 500, actor)
        self.sleep(self.choices.one_of([0.002, 0.02, 0.2]))
        if isinstance(outcome, ClientError):
            raise outcome
        return outcome

    def hedged(
        self,
        actor: Actor,
        send: Callable[[str, dict[str, Any]], dict[str, Any]],
        operation: str,
        params: dict[str, Any],
        late: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """A request the engine would hedge (Store.send with ``hedge``): with ``Choices(hedge=True)``
        its first copy may be late, held in the network before it lands or applied with its
        reply late (or never: lost), and a second copy goes out ``send`` (meeting a fate of
        its own) after a hedge delay. What the sender sees is the engine's own ``Race`` of the
        two, fed their outcomes in the order they arrive: the first copy's may come while the
        second is in flight (the sender then wakes late, as a thread can), or after it. A
        first copy applied after the second had won is told to ``late`` when its reply comes."""
        if not self.choices.hedge or self.healed or self.now < actor.cut_until:
            return send(operation, params)
        if not self.choices.weighted([(False, 6), (True, 1)]):
            return send(operation, params)
        from django_dynlock.engine.hedging import Race

        self._step()
        if self.rewrite is not None:
            params = self.rewrite(operation, params)
        api = self.store.meta.method_to_api_mapping[operation]
        started = self.now
        timeout = self.choices.one_of([2.0, 0.3])
        kind = self.choices.one_of(["held", "slow_reply"])
        lands = self.choices.one_of([0.05, 0.5, 1.5, None]) if kind == "held" else 0.002
        replies = (lands or 0.0) + (self.choices.one_of([0.05, 0.5, 1.5]) if kind == "slow_reply" else 0.002)
        self.log(f"{actor.name} {api} hedged: first copy {kind}, lands {lands}, reply at {replies}")
        first: list[Any] = []
        frozen = _deepcopy(params)
        # Its reply, or the timeout, reaches the sender then.
        first_at = started + replies if lands is not None and replies < timeout else started + timeout
        lost_race: list[bool] = []  # set once the second copy won

        def tell_late() -> None:
            outcome = first[0]
            if late is not None and not isinstance(outcome, ClientError) and first_at < started + timeout:

                def told() -> None:
                    if not actor.crashed:
                        self.log(f"{actor.name} hears its first copy of {api} was applied late")
                        late(outcome)

                self.at(first_at, actor, told)

        if lands is not None:

            def land() -> None:
                self.log(f"{actor.name}'s first copy of {api} lands")
                first.append(self._apply(operation, frozen, to=actor))
                if lost_race:
                    tell_late()

            self.at(started + lands, None, land)
        self.sleep(self.choices.one_of([0.005, 0.03]))  # the hedge delay: the first reply is late
        second: tuple[dict[str, Any] | None, BaseException | None]
        try:
            second = (send(operation, params), None)
        except Crashed:
            raise
        except Exception as exc:
            second = (None, exc)
        second_at = self.now

        def first_outcome() -> tuple[dict[str, Any] | None, BaseException | None]:
            if first and first_at < started + timeout:
                outcome = first[0]
                return (None, outcome) if isinstance(outcome, ClientError) else (outcome, None)
            return None, ReadTimeoutError(endpoint_url=ENDPOINT)

        race = Race(2, patient=late is not None)
        if first_at <= second_at:
            if not race.arrived(*first_outcome()):
                race.arrived(*second)
        elif not race.arrived(*second):
            self.sleep(first_at - self.now)
            if actor.crashed:
                raise Crashed(actor.name)
            race.arrived(*first_outcome())
        if race.reply is not None and race.reply is second[0]:
            lost_race.append(True)
            if first:
                tell_late()
        self.log(f"{actor.name} {api} hedged: {'reply' if race.reply is not None else 'failed'}")
        return race.result()

    def _hold(
        self, actor: Actor, api: str, operation: str, params: dict[str, Any], later: float | str, *, copy: bool
    ) -> None:
        frozen = _deepcopy(params)

        def land() -> None:
            self.log(f"late {api} lands")
            self._apply(operation, frozen, copy=copy)

        if later == RIVAL:
            self._ambushes.append((actor, _expiries(params), land))
        else:
            self.at(self.now + float(later), None, land)

    def _spring(self, actor: Actor, params: dict[str, Any]) -> None:
        """Requests held for a takeover they can affect land now, just before it: one of another
        actor conditioned on DynamoDB's clock (``:earliest``) having passed the expiry they set."""
        if not self._ambushes:
            return
        takeovers = _takeovers(params)
        due = [
            a
            for a in self._ambushes
            if a[0] is not actor and any(key in takeovers and takeovers[key] > at for key, at in a[1].items())
        ]
        if due:
            self._ambushes = [a for a in self._ambushes if a not in due]
            for held_by, _, land in due:
                self.log(f"{held_by.name}'s request held for a rival: {actor.name} sends on its key")
                land()

    def _apply(
        self, operation: str, params: dict[str, Any], *, copy: bool = False, to: Actor | None = None
    ) -> dict[str, Any] | ClientError:
        """The request reaches the store: its reply as the sender (``to``, None if nobody waits) would see it."""
        date = self._date_header(to)
        try:
            reply = getattr(self.store, operation)(**_deepcopy(params))
        except ClientError as exc:
            response = _deepcopy(exc.response)
            if not self.returns_item:
                response.pop("Item", None)
                for reason in response.get("CancellationReasons") or []:
                    reason.pop("Item", None)
            self._set_date(response, date)
            failed = ClientError(response, exc.operation_name)
            if self.on_apply is not None:
                self.on_apply(operation, params, failed, copy)
            return failed
        reply = _deepcopy(reply)
        self._set_date(reply, date)
        if self.on_apply is not None:
            self.on_apply(operation, params, reply, copy)
        return reply

    def _date_header(self, to: Actor | None) -> str | None:
        # The server's clock is the world's true clock; HTTP dates have whole seconds. What
        # reaches an actor may have passed a proxy that strips or rewrites it.
        if not self.dates or (to is not None and to.strip_date):
            return None
        date = self.now
        if to is not None:
            date += to.date_skew
            if to.outlier is not None:
                first, every, off = to.outlier
                if to.dated == first or (every and to.dated > first and (to.dated - first) % every == 0):
                    date += off
            to.dated += 1
        return formatdate(math.floor(date), usegmt=True)

    @staticmethod
    def _set_date(response: dict[str, Any], date: str | None) -> None:
        headers = response.setdefault("ResponseMetadata", {}).setdefault("HTTPHeaders", {})
        headers.pop("date", None)
        if date is not None:
            headers["date"] = date

    def _error(self, api: str, code: str, status: int, to: Actor) -> ClientError:
        response: dict[str, Any] = {
            "Error": {"Code": code, "Message": "injected by the schedule explorer"},
            "ResponseMetadata": {"HTTPStatusCode": status, "HTTPHeaders": {}},
        }
        self._set_date(response, self._date_header(to))
        return ClientError(response, api)


def _updates(params: dict[str, Any]) -> list[dict[str, Any]]:
    """A write's updates: itself, or a transaction's."""
    return [entry["Update"] for entry in params.get("TransactItems", []) if "Update" in entry] or [params]


def _expiries(params: dict[str, Any]) -> dict[str, float]:
    """The expiry a write sets, by lock key (an acquire's, a renewal's)."""
    return {
        update["Key"]["key"]["S"]: float(update["ExpressionAttributeValues"][":expires"]["N"])
        for update in _updates(params)
        if ":expires" in update.get("ExpressionAttributeValues", {}) and "Key" in update
    }


def _takeovers(params: dict[str, Any]) -> dict[str, float]:
    """The earliest reading of DynamoDB's clock a write may take a key at, by lock key."""
    return {
        update["Key"]["key"]["S"]: float(update["ExpressionAttributeValues"][":earliest"]["N"])
        for update in _updates(params)
        if ":earliest" in update.get("ExpressionAttributeValues", {}) and "Key" in update
    }


class WorldHedger:
    """The Store's hedger in the world (engine/hedging.py's Hedger uses threads and real time):
    each request the engine would hedge goes to World.hedged."""

    def __init__(self, world: World, actor: Actor):
        self._world = world
        self._actor = actor
        self.hedged = 0

    def send(
        self,
        send: Callable[[str, dict[str, Any]], dict[str, Any]],
        operation: str,
        params: dict[str, Any],
        late: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        return self._world.hedged(self._actor, send, operation, params, late)

    def shutdown(self) -> None:
        pass


class Wire:
    """What an actor's LockClient takes for its boto3 client: every call goes through the world."""

    def __init__(self, world: World, actor: Actor):
        self._world = world
        self._actor = actor
        self.meta = world.store.meta

    def __getattr__(self, operation: str) -> Callable[..., dict[str, Any]]:
        if operation.startswith("_"):
            raise AttributeError(operation)
        return lambda **params: self._world.request(self._actor, operation, params)


class VirtualTime:
    """The ``time`` module as the engine sees it: the running actor's clocks."""

    def __init__(self, world: World):
        self._world = world

    def monotonic(self) -> float:
        actor = self._world.actor
        return actor.mono(self._world.now) if actor else self._world.now - T0

    def time(self) -> float:
        actor = self._world.actor
        return actor.wall(self._world.now) if actor else self._world.now

    def time_ns(self) -> int:
        return int(self.time() * 1e9)

    def sleep(self, seconds: float) -> None:
        self._world.sleep(seconds)


class VirtualUUID:
    """uuid4() in sequence, so that owner ids (and so release slots) replay exactly."""

    def __init__(self, world: World):
        self._world = world

    def uuid4(self) -> uuid.UUID:
        return self._world.new_uuid()


class SimHeartbeater:
    """The heartbeat thread as events of the world (same interface as engine.heartbeat.Heartbeater)."""

    def __init__(self, world: World, actor: Actor, renew: Callable[[Any], float | None]):
        self._world = world
        self._actor = actor
        self._renew = renew
        self._stopped = False

    def add(self, lease: Any, period: float) -> None:
        self.schedule(lease, self._actor.mono(self._world.now) + period * self._world.rng.uniform(0.8, 1.0))

    def schedule(self, lease: Any, due: float) -> None:
        if self._stopped:
            return
        lease.upkeep.heartbeat_due = due
        self._world.at(self._actor.true(due), self._actor, lambda: self._fire(lease, due))

    def _fire(self, lease: Any, due: float) -> None:
        if self._stopped or self._actor.crashed or lease.upkeep.heartbeat_due != due:
            return
        if lease.upkeep.renew_lock.locked():
            # An extend() of this lease is in flight further up the stack: the real
            # heartbeat thread would block on the lock until it is done.
            self.schedule(lease, self._actor.mono(self._world.now) + 0.005)
            return
        try:
            delay = self._renew(lease)
        except Crashed:
            return
        if delay is not None:
            self.schedule(lease, self._actor.mono(self._world.now) + delay)

    def alarm(self, due: float, callback: Callable[[], None]) -> None:
        def ring() -> None:
            if not self._stopped and not self._actor.crashed:
                callback()

        self._world.at(self._actor.true(due), self._actor, ring)

    def retry(self, due: float, task: Callable[[], float | None]) -> None:
        def fire() -> None:
            if self._stopped or self._actor.crashed:
                return
            try:
                delay = task()
            except Crashed:
                return
            if delay is not None:
                self.retry(self._actor.mono(self._world.now) + delay, task)

        if not self._stopped:
            self._world.at(self._actor.true(due), self._actor, fire)

    def discard(self, lease: Any) -> None:
        pass

    def stop(self, timeout: float = 0.5) -> None:
        self._stopped = True
