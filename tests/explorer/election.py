"""The election world: standbys and leaders of one election in the simulated world.

Three actors each run the real :class:`~django_dynlock.engine.election.Election` on their
own client, as ``run()`` does: ``campaign(wait=None)``, then while leading a look at
``term.is_held`` every 0.25 s (the function's check), and once the term has ended (resigned
or lost) a campaign again. The campaign is the generator of steps that ``campaign``,
``campaign_async`` and ``run()`` all drive (``Election._campaign_steps``): here each step is
performed as ``steps.run`` performs it, but a sleep, which becomes an event of the world at
the actor's wake-up time (``Actor.when``), so that the other actors run meanwhile and
nothing blocks. Every request meets a fate of world.py.

Drawn: the server and lease (``Scenario``), the cadence ``poll``, when each actor starts
campaigning, how long each leader leads before it resigns (or until its term is lost),
and one to six disruptions: the link of the current leader cut (for half a lease, a
lease, two or four), another actor's link cut, the leader or another actor crashed (a
new process on its host a while later, campaigning afresh). Not drawn: operator breaks
(an overlap after a break is documented), handovers, TTL deletions, ``cancel()`` and
``observe``.

Invariants, besides the ledger's five on the election's key (scenario.py; the first,
exclusion, is "never two leaders by their own belief": a term is believed from the
moment campaign returned it while ``is_held`` says so, until its resignation):

E1. **Tokens increase per term**: in the order campaigns returned them.
E2. **Told before another acts**: a term that ended other than by its resignation or its
    process' crash had its ``on_lost`` callback called before the next term was
    returned to anyone.
E3. **A leader again**: once the network heals, a live actor leads within the longest
    late request (8 s), two leases, the takeover slack and two polls.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from unittest import mock

from django_dynlock.engine import election as election_module
from django_dynlock.engine.election import Election
from django_dynlock.engine.lease import Lease
from django_dynlock.engine.steps import Sleep, Steps, perform
from django_dynlock.exceptions import DynLockError

from .scenario import EPSILON, TAKEOVER_SLACK, Scenario, simulated
from .world import T0, Actor, Choices, Crashed, SimHeartbeater


class PunctualHeartbeater(SimHeartbeater):
    """SimHeartbeater whose alarms ring when the actor's clock reads their due time.

    ``SimHeartbeater.alarm`` rings at ``actor.true(due)``, whose reading on the actor's
    clock may round to just below ``due``: then ``_lose_if_ended`` (``monotonic() >=
    end``) finds the term not yet ended and does nothing, and the loss is told only at the
    next renewal's answer, as no real alarm thread (which waits until ``due``) would.
    Here, not in world.py: with it there, the lease world's hand-built ``release-lost``
    counterexample (test_explorer.py, SHRUNK) no longer catches its reverted fix.
    """

    def alarm(self, due: float, callback: Callable[[], None]) -> None:
        actor = self._actor

        def ring() -> None:
            if not self._stopped and not actor.crashed:
                callback()

        self._world.at(actor.when(due), actor, ring)


NAME = "leader"
LEADING_TICK = 0.25  # how often a leader looks at its term (its scheduler's tick)
LONGEST_HELD = 8.0  # the longest a request is held in the network (world.py)


@dataclass
class Term:
    term: Lease
    actor: Actor
    elected: float  # true time campaign returned it
    resigned: float | None = None
    lost: float | None = None  # true time its on_lost callback was called
    crashed: float | None = None


class ElectionScenario(Scenario):
    """One schedule of the election world, drawn from ``choices`` and run against ``store``."""

    def __init__(self, choices: Choices, store: Any):
        super().__init__(choices, store)
        c = self.choices
        self.poll = c.one_of([2.0, 0.5, 1.0])
        self.elections: dict[str, Election] = {}
        self.terms: list[Term] = []
        self.by_term: dict[int, Term] = {}
        self.healed_at: float | None = None
        self.done = False

    def _client(self, actor: Actor) -> Any:
        client = super()._client(actor)
        client._keeper.heartbeater = PunctualHeartbeater(self.world, actor, client._keeper.heartbeat)  # type: ignore[assignment]
        return client

    # -- running ----------------------------------------------------------------------------
    def run(self) -> Any:
        world, c, lease = self.world, self.choices, self.lease
        with simulated(world, self.ledger), self._election_jitter():
            for actor in [*self.actors, self.operator]:
                self._client(actor)
            for actor in self.actors:
                self._stand(actor, world.now + c.one_of([0.0, 0.1, 0.5, lease]))
            at = world.now
            for _ in range(1 + c.pick(6)):
                at += c.one_of([lease, 0.5, lease / 2, 2 * lease])
                kind = c.weighted([("cut-leader", 4), ("crash-leader", 2), ("cut", 1), ("crash", 1)])
                cut_for = c.one_of([lease, lease / 2, 2 * lease, 4 * lease])
                restart = c.one_of([lease, 0.5, 2 * lease])
                other = c.pick(3)
                world.at(at, None, lambda k=kind, f=cut_for, r=restart, o=other: self._disrupt(k, f, r, o))
            # Every restart (at most two leases after the last disruption) happens before the heal.
            world.run_until(at + 3 * lease)
            self._heal()
            for actor in self.actors:
                if not actor.crashed:
                    world.run_as(actor, actor.client.close)
            world.run_as(self.operator, self.operator.client.close)
        self.ledger.check_all()
        self._check_terms()
        return self.ledger

    @contextlib.contextmanager
    def _election_jitter(self) -> Iterator[None]:
        # The standby's jitter from the world's stream, so that a schedule replays exactly.
        with mock.patch.object(election_module, "random", self.world.rng):
            yield

    def _stand(self, actor: Actor, when: float) -> None:
        """A contender on ``actor``'s current client, campaigning from ``when`` on."""
        election = Election(actor.client, NAME, poll=self.poll)
        generation = actor.generation
        election.on_lost(lambda term, reason: self._lost(term))
        self.elections[actor.name] = election
        self.world.at(when, actor, lambda: self._campaign(actor, election, generation))

    def _gone(self, actor: Actor, generation: int) -> bool:
        """Whether that process is gone (its events end with it), or the schedule is over."""
        return actor.crashed or actor.generation != generation or self.done

    def _campaign(self, actor: Actor, election: Election, generation: int) -> None:
        """``campaign(wait=None)``, as ``run()`` calls it again after each term: its own steps."""
        if not self._gone(actor, generation):
            self._drive(actor, election, generation, election._campaign_steps(None))

    def _drive(self, actor: Actor, election: Election, generation: int, steps: Steps[Lease], reply: Any = None) -> None:
        """``steps.run`` in virtual time: each step performed as ``run`` performs it, but a
        sleep, which becomes an event of the world at the actor's wake-up time, so that
        the others run meanwhile and nothing blocks."""
        world = self.world
        if self._gone(actor, generation):
            steps.close()
            return
        if actor.busy:  # an operation of its own is in flight further up the stack
            world.at(
                actor.when(actor.mono(world.now) + 0.005),
                actor,
                lambda: self._drive(actor, election, generation, steps, reply),
            )
            return
        failure: BaseException | None = None
        actor.busy = True
        try:
            while True:
                try:
                    step = steps.send(reply) if failure is None else steps.throw(failure)
                except StopIteration as done:
                    term: Lease = done.value
                    break
                reply, failure = None, None
                if isinstance(step, Sleep):
                    due = actor.mono(world.now) + step.seconds
                    world.at(actor.when(due), actor, lambda: self._drive(actor, election, generation, steps))
                    return
                try:
                    reply = perform(step, actor.client._keylocks)
                except BaseException as exc:  # thrown in, as run does: the steps undo what they must
                    failure = exc
        except Crashed:
            return  # its process crashed during a request: its campaign ends with it
        except DynLockError as exc:
            # Refused for good (run() would raise it): a supervisor starts it again a poll later.
            world.log(f"{actor.name} campaign failed: {exc!r}")
            world.at(
                actor.when(actor.mono(world.now) + self.poll),
                actor,
                lambda: self._campaign(actor, election, generation),
            )
            return
        except Exception as exc:
            self.ledger.violate(f"{actor.name}'s campaign raised {exc!r}")
            return
        finally:
            actor.busy = False
        self._elected(actor, election, generation, term)

    def _elected(self, actor: Actor, election: Election, generation: int, term: Lease) -> None:
        self.ledger.check_returned([term])
        self.world.log(f"{actor.name} elected, term {term.token}")
        record = Term(term, actor, self.world.now)
        self.terms.append(record)
        self.by_term[id(term)] = record
        hold = self.choices.one_of([math.inf, 0.2, self.lease / 2, self.lease, 3 * self.lease])
        if hold != math.inf:
            self.world.at(self.world.now + hold, actor, lambda: self._resign(actor, record))
        self._lead(actor, election, generation, record)

    def _lead(self, actor: Actor, election: Election, generation: int, record: Term) -> None:
        """While leading, what ``run()``'s function does: look at the term every tick. Once
        it has ended (resigned, or lost), campaign again."""
        if self._gone(actor, generation):
            return
        world = self.world
        if record.term.is_held or actor.busy:
            again = actor.when(actor.mono(world.now) + LEADING_TICK)
            world.at(again, actor, lambda: self._lead(actor, election, generation, record))
            return
        self._campaign(actor, election, generation)

    def _resign(self, actor: Actor, record: Term) -> None:
        if actor.crashed or actor.busy or record.crashed is not None or not record.term.is_held:
            return
        actor.busy = True
        try:
            record.resigned = self.world.now
            self.world.log(f"{actor.name} resigns term {record.term.token}")
            self._release_handle(actor, record.term, [record.term])
        except Crashed:
            pass
        finally:
            actor.busy = False

    def _lost(self, term: Lease) -> None:
        record = self.by_term.get(id(term))
        if record is not None and record.lost is None:
            record.lost = self.world.now
            self.world.log(f"{record.actor.name} told term {term.token} is lost")

    def _leader(self) -> Actor | None:
        for actor in self.actors:
            election = self.elections.get(actor.name)
            if not actor.crashed and election is not None and election.is_leader:
                return actor
        return None

    def _disrupt(self, kind: str, cut_for: float, restart: float, other: int) -> None:
        leader = self._leader()
        victim = leader if kind.endswith("leader") and leader is not None else self.actors[other]
        if kind.startswith("cut"):
            self._cut(victim, cut_for)
            return
        if victim.crashed:
            return
        for record in self.terms:
            if record.actor is victim and record.crashed is None:
                record.crashed = self.world.now
        self._crash(victim)
        self.world.at(self.world.now + restart, None, lambda: self._new_process(victim))

    def _new_process(self, actor: Actor) -> None:
        self.world.log(f"{actor.name} restarts")
        actor.client._keeper.heartbeater.stop()
        actor.generation += 1
        actor.crashed = actor.busy = False
        actor.dated = 0
        self._client(actor)
        self._stand(actor, self.world.now)

    # -- the end ------------------------------------------------------------------------------
    def _bound(self) -> float:
        return LONGEST_HELD + 2 * self.lease + TAKEOVER_SLACK + 2 * self.poll

    def _heal(self) -> None:
        world = self.world
        world.healed = True
        self.healed_at = world.now
        for actor in self.actors:
            actor.cut_until = -math.inf
        while self._leader() is None and world.now < self.healed_at + self._bound():
            world.run_until(world.now + 0.5)
        leader = self._leader()
        if leader is None and not all(actor.crashed for actor in self.actors):
            self.ledger.violate(
                f"no leader {self._bound():.1f}s after the network healed, with "
                f"{sum(not a.crashed for a in self.actors)} live contenders (E3)"
            )
        self.done = True  # no more ticks
        if leader is not None:
            record = next(r for r in reversed(self.terms) if r.actor is leader)
            world.run_as(leader, lambda: self._resign(leader, record))
        world.run_until(world.now + 2 * self.lease)  # releases retried in the background finish

    def _check_terms(self) -> None:
        for earlier, later in zip(self.terms, self.terms[1:]):
            if later.term.token <= earlier.term.token:
                self.ledger.violate(
                    f"term {later.term.token} ({later.actor.name}) elected after term {earlier.term.token} "
                    f"({earlier.actor.name}) (E1)"
                )
            ended_by_itself = earlier.resigned is not None or earlier.crashed is not None
            if (
                ended_by_itself
                and min(x for x in (earlier.resigned, earlier.crashed) if x is not None) <= later.elected
            ):
                continue
            if earlier.lost is None or earlier.lost > later.elected + EPSILON:
                told = "never" if earlier.lost is None else f"at t={earlier.lost - T0:.3f}s"
                self.ledger.violate(
                    f"term {earlier.term.token} ({earlier.actor.name}) was told of its loss {told}, "
                    f"after term {later.term.token} ({later.actor.name}) was elected at "
                    f"t={later.elected - T0:.3f}s (E2)"
                )
