"""The semaphore world: holders of one semaphore's slots in the simulated world.

Three actors acquire one key with ``limit=2`` (waiting or not, or ``try_acquire``), take
it as a lock now and then (a lock holds the semaphore's slot 0), release, extend, crash
and have their links cut, every request meeting a drawn fate of world.py. Not drawn:
breaks, handovers, TTL deletions, a change of the limit.

Invariants, besides the ledger's five on each slot's item (scenario.py):

S1. **Never more than N**: at no true time do more than ``LIMIT`` acquisitions believe
    they hold one of the key's slots (a lease is believed as the ledger counts it: from
    the moment acquire returned it while ``is_held`` says so, until its release).
S2. **No stuck slots**: at the end, with the network healed and every live holder
    released, ``LIMIT`` acquires take every slot (within a lease + 3 s if a crashed actor
    or an undo that could not reach the store left one held).
"""

from __future__ import annotations

from collections.abc import Callable

from django_dynlock.engine.items import split_stored
from django_dynlock.engine.keys import slot_key
from django_dynlock.exceptions import LockNotAcquired

from .scenario import EPSILON, TAKEOVER_SLACK, Scenario
from .world import T0, Actor

SEM = "sem"
LIMIT = 2
SLOTS = [slot_key(SEM, i) for i in range(LIMIT)]


class SemaphoreScenario(Scenario):
    # More than the lease world's: N + 1 acquisitions must overlap for S1 to be tested.
    operations = 20

    def _draw_operation(self, actor: Actor) -> tuple[Callable[[], None], bool]:
        c, lease = self.choices, self.lease
        kind = c.weighted(
            [("acquire", 8), ("release", 3), ("try", 3), ("lock", 1), ("extend", 2), ("crash", 1), ("cut", 1)]
        )
        wait = c.one_of([0.0, 0.3, lease + 1.0])
        pick = c.pick(3)
        new_lease = c.one_of([lease, lease / 2, lease * 2])
        cut_for = c.one_of([0.5, lease, 2 * lease])
        if kind == "acquire":
            return (lambda: self._acquire(actor, [SEM], lambda cl: cl.acquire(SEM, wait=wait, limit=LIMIT))), True
        if kind == "try":
            return (lambda: self._acquire(actor, [SEM], lambda cl: cl.try_acquire(SEM, limit=LIMIT))), True
        if kind == "lock":
            return (lambda: self._acquire(actor, [SEM], lambda cl: cl.acquire(SEM, wait=wait))), True
        if kind == "release":
            return (lambda: self._release(actor, pick)), True
        if kind == "extend":
            return (lambda: self._extend(actor, pick, new_lease)), True
        if kind == "crash":
            return (lambda: self._crash(actor)), False
        return (lambda: self._cut(actor, cut_for)), False

    def _crash(self, actor: Actor, restart: float | None = None) -> None:
        super()._crash(actor, restart)
        self.ledger.excused.update(SLOTS)

    def _settle(self) -> None:
        super()._settle()
        world, ledger = self.world, self.ledger
        checker = Actor(5, "slot-checker")
        self._client(checker)
        excused = any(slot in ledger.excused for slot in SLOTS)
        wait = self.longest + TAKEOVER_SLACK if excused else 0.0
        taken = []
        for _ in range(LIMIT):
            started = world.now
            try:
                taken.append(world.run_as(checker, lambda: checker.client.acquire(SEM, wait=wait, limit=LIMIT)))
            except LockNotAcquired as busy:
                ledger.violate(
                    f"a slot of {SEM} still held {world.now - started:.2f}s into the final check "
                    f"({'bound: lease + 3 s' if excused else 'nobody holds it'}): {busy.holder!r} (S2)"
                )
        for lease in taken:
            world.run_as(checker, lease.release)
        world.run_as(checker, checker.client.close)

    def run(self):  # type: ignore[no-untyped-def]
        ledger = super().run()
        self.check_limit()
        return ledger

    def check_limit(self) -> None:
        """S1: a sweep over the believed intervals of every acquisition of the key's slots."""
        spans: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for rec in self.ledger.records.values():
            if split_stored(rec.key)[0] == SEM:  # any slot item of the key, past the limit too
                # An acquire's restamp makes a second Lease of one acquisition: one belief.
                spans.setdefault((rec.key, rec.lease.owner), []).extend(rec.believed())
        edges = sorted(
            [(low, 1, who) for who, intervals in spans.items() for low, _ in intervals]
            + [(high - EPSILON, -1, who) for who, intervals in spans.items() for _, high in intervals]
        )
        holding: dict[tuple[str, str], int] = {}
        self.most = 0  # the most acquisitions that believed at once: how near the bound a schedule came
        for at, step, who in edges:  # an end (shortened by EPSILON) sorts before a start at the same time
            holding[who] = holding.get(who, 0) + step
            believers = [w for w, n in holding.items() if n > 0]
            self.most = max(self.most, len(believers))
            if len(believers) > LIMIT:
                self.ledger.violate(
                    f"{len(believers)} holders of {SEM} (limit {LIMIT}) believed held at t={at - T0:.3f}s: "
                    + ", ".join(f"{owner} on {key!r}" for key, owner in sorted(believers))
                    + " (S1)"
                )
                return
