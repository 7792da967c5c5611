"""The schedule explorer: schedules of the simulated world (world.py, scenario.py) drawn by
Hypothesis, which shrinks any that breaks an invariant, and by a seeded sweep.

``make test`` runs a bounded, derandomized Hypothesis run and the counterexamples found so
far. ``DYNLOCK_EXPLORE=long`` (nightly) runs far more examples with a fresh seed, and a
sweep over 20,000 seeded schedules.
"""

from __future__ import annotations

import ast
import os
import re
import time

import pytest
from hypothesis import HealthCheck, Phase, given, settings, target
from hypothesis import strategies as st

from localdynamo.servers import DUMMY_CREDENTIALS, DUMMY_REGION

from .reverted import FIXES, reverted
from .scenario import Ledger, Scenario, Violation
from .world import Choices, SeededChoices

# In virtual time, and CPU-bound: on a worker at low priority (tests/conftest.py).
pytestmark = pytest.mark.background

PROFILE = os.environ.get("DYNLOCK_EXPLORE", "quick")
if PROFILE not in ("quick", "long"):
    raise RuntimeError(f"DYNLOCK_EXPLORE must be 'quick' or 'long', not {PROFILE!r}")
LONG = PROFILE == "long"

# Schedules of the seeded sweep that broke an invariant, and what was fixed for each. Each
# fails on the engine as it was before this round's fixes (commit e506267) and passes now.
COUNTEREXAMPLES = {
    28: "acquire_many's first transaction, stamped by a wall clock 45 s slow, handed out ended leases",
    382: "a client's first acquire was restamped, but the reply came a lease late: it handed out an ended lease",
    428: "acquire_many without transactions: the first key ran out while the call waited for the second",
    758: "acquire_many without transactions: the first key ran out while the call waited for the second",
    648: "an attempt delayed in the network landed between the failed undo and the slot mark: a ghost holder",
    937: "an attempt delayed in the network landed between the failed undo and the slot mark: a ghost holder",
    1263: "a copy of the holder's acquire landed after a break and undid it; release() then returned normally",
    1609: "a copy of the holder's acquire landed after a break and undid it; release() then returned normally",
}


@pytest.fixture(scope="module")
def store():
    import boto3
    from moto import mock_aws

    with mock_aws():
        yield boto3.client("dynamodb", region_name=DUMMY_REGION, **DUMMY_CREDENTIALS)


def guide(ledger: Ledger) -> None:
    """Point Hypothesis at schedules near a stale write of a holder taking effect (a measure
    of the search only, never an invariant): see Ledger.rewind and Ledger.takeover_margin."""
    target(ledger.rewind, label="a holder's expiry moved back by (s)")
    if ledger.takeover_margin is not None:
        target(ledger.takeover_margin, label="a takeover came this near a trusted lease (s)")


def explore(choices: Choices, store, fix: str | None = None) -> Scenario:
    """Run one schedule (with ``fix`` reverted, reverted.py); Violation if it breaks an invariant."""
    with reverted(fix) as rewrite:
        scenario = Scenario(choices, store)
        scenario.world.rewrite = rewrite
        ledger = scenario.run()
    if ledger.violations:
        raise Violation(
            "\n".join(ledger.violations)
            + f"\nserver={scenario.server} lease={scenario.lease}"
            + f"\nreplay with Choices(replay={choices.log!r})\n"
            + "\n".join(scenario.world.trace[-60:])
        )
    return scenario


def searching(max_examples: int):
    """The Hypothesis settings of a search: derandomized in make test, fresh in the long profile."""
    return settings(
        max_examples=max_examples,
        deadline=None,
        derandomize=not LONG,
        database=None,
        phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


@searching(3000 if LONG else 100)
@given(st.data())
def test_no_schedule_breaks_an_invariant(store, data):
    explore(Choices(data), store)


# Issue 29's world: each actor's own Date source (DynamoDB's clock, a lone outlier up to
# 60 s off, none), wall clocks up to 60 s off, handovers (twice delivered, released after
# the adoption) and TTL deletions. Fewer examples: every schedule also runs in the test above
# would shift its recorded draws (world.Choices.clocks).
@searching(1000 if LONG else 30)
@given(st.data())
def test_no_schedule_of_disagreeing_clocks_and_handovers_breaks_an_invariant(store, data):
    explore(Choices(data, clocks=True), store)


# Hedged requests (engine/hedging.py): a request the engine would hedge may be late (held
# before it lands, or applied with its reply late or lost) and get a second copy with a fate
# of its own; the sender sees the engine's own Race of the two (World.hedged). Behind
# Choices(hedge=True), so that the other searches and seeds keep their schedules.
@searching(1000 if LONG else 60)
@given(st.data())
def test_no_schedule_with_hedged_requests_breaks_an_invariant(store, data):
    explore(Choices(data, hedge=True), store)


def test_seeded_schedules_with_hedged_requests_keep_every_invariant(store):
    hedged = replies = 0
    for seed in range(40):
        trace = explore(SeededChoices(seed, hedge=True), store).world.trace
        hedged += sum("hedged: first copy" in line for line in trace)
        replies += sum(line.endswith("hedged: reply") for line in trace)
    assert hedged >= 40 and 0 < replies < hedged, (hedged, replies)  # the draw is exercised, both ways


@pytest.mark.parametrize("seed", sorted(COUNTEREXAMPLES))
def test_counterexample_stays_fixed(store, seed):
    explore(SeededChoices(seed), store)


# Schedules of the seeded sweep of issue 29's world that broke an invariant, and what was
# fixed for each. Each fails on the engine before its fix and passes now.
CLOCK_COUNTEREXAMPLES = {
    # B's first reply took 2.4 s, so its clock bounds were 3.4 s wide; its next reply, from
    # a clock 2 s behind, overlapped them, so ServerClock.observe took it as agreeing and
    # narrowed the upper bound to it, 1.17 s below DynamoDB's clock. B's renewal stamped its
    # expiry with that bound; A's acquire took the key 0.048 s before B stopped trusting it.
    # Fixed: no reply narrows the bounds alone (a bound moves inwards as far as this reply
    # and the one before it both allow).
    1251: "a lone reply 2 s behind, overlapping the bounds, narrowed them below DynamoDB's clock",
}


@pytest.mark.parametrize("seed", sorted(CLOCK_COUNTEREXAMPLES))
def test_counterexample_of_disagreeing_clocks_stays_fixed(store, seed):
    explore(SeededChoices(seed, clocks=True), store)


@pytest.mark.skipif(not LONG, reason="the long sweep runs with DYNLOCK_EXPLORE=long")
def test_seeded_sweep(store):
    failed = []
    for seed in range(20_000):
        try:
            explore(SeededChoices(seed), store)
        except Violation as violation:
            failed.append(f"seed {seed}: {str(violation).splitlines()[0]}")
    assert not failed, "\n".join(failed)


# Fixes reverted (reverted.py: at the wire, or by patching in the code from before them).
# The explorer must find each again (the nightly profile). Issue 29's are found in the
# schedules of its world (Choices(clocks=True): Date sources, wall clocks, handovers, TTL).
ISSUE_29 = {"adopt-restamp", "clock-outliers", "date-less", "fence-base", "handover-seq", "release-lost"}


def seeded(fix: str | None, seed: int) -> SeededChoices:
    return SeededChoices(seed, clocks=fix in ISSUE_29)


def replayed(fix: str, replay: list[int]) -> Choices:
    return Choices(replay=replay, clocks=fix in ISSUE_29)


# Reverted fixes that no sweep has found (900 seeds each of 5000-5900, and shorter runs):
# their counterexamples were built by hand (SHRUNK), so the sweep below does not expect them.
BY_HAND = {"fence-base", "release-lost"}


@pytest.mark.skipif(not LONG, reason="runs with DYNLOCK_EXPLORE=long")
@pytest.mark.parametrize("fix", [fix for fix in FIXES if fix not in BY_HAND])
def test_the_explorer_finds_a_reverted_fix(store, fix):
    for seed in range(5_000):
        try:
            explore(seeded(fix, seed), store, fix)
        except Violation:
            return
    pytest.fail(f"5,000 schedules did not find the bug that {fix} fixed")


# A schedule of the seeded sweep that catches each reverted fix: make test checks that the
# explorer still does, and that the same schedule passes with the fix.
# Issue 29's are seeds of its world (Choices(clocks=True)), found by `python -m
# tests.explorer.sweep 400 FIX`; docs/testing.md says what each breaks.
CATCHES = {
    "ordered-writes": 1200,
    "release-slots": 391,
    # A taker whose one reply dated 5 s ahead reset its clock took an adopter's live lease.
    "clock-outliers": 242,
    # release_handover after the adoption freed the adopter's lease; the giver took the key.
    "handover-seq": 44,
    # A holder 60 s slow whose replies carry no Date stamps by its wall clock: taken at once.
    "date-less": 168,
    # An adopt whose replies were lost returned a lease that had ended meanwhile.
    "adopt-restamp": 455,
}


def sparse(length: int, nonzero: dict[int, int]) -> list[int]:
    """A recorded choice list: ``length`` choices, 0 (the default) but where ``nonzero`` says."""
    return [nonzero.get(i, 0) for i in range(length)]


# Each reverted fix's schedule of CATCHES, shrunk (``python -m tests.explorer.shrink FIX
# SEED``: the tail cut and each choice lowered towards the default while the replay still
# breaks an invariant with the fix reverted and passes with it). Re-shrunk in issue 29:
# every client now reads the key once before its first write, one request more at the
# start, which shifted every recorded schedule, and the ones Hypothesis had shrunk (long
# tests below) no longer caught either bug. The release-slot guard: four choices away from
# the default one. The ordered writes: thirteen.
SHRUNK = {
    "release-slots": sparse(90, {0: 1, 9: 7, 86: 70, 89: 4}),
    # Issue 29's world (Choices(clocks=True)): CATCHES' seeds shrunk the same way.
    "clock-outliers": sparse(66, {11: 3, 14: 4, 15: 5, 61: 1, 62: 2, 65: 1}),
    "handover-seq": sparse(30, {11: 3, 18: 21, 29: 3}),
    "date-less": sparse(45, {3: 6, 9: 6, 11: 3, 15: 3, 43: 1, 44: 1}),
    # Built by hand from the draw order (none of the sweeps run found one), then shrunk:
    # TTL deletes a released key, and a fresh client 60 s slow whose first read was refused
    # starts a new counter from its wall clock, below the token issued before.
    "fence-base": sparse(62, {3: 6, 12: 3, 14: 1, 22: 1, 23: 1, 24: 6, 31: 5, 33: 25, 61: 86}),
    # Built likewise: a break, then the holder cut off releases; its release goes on in the
    # background, finds the break once the link is back, and must say so.
    "release-lost": sparse(74, {12: 3, 22: 1, 24: 17, 33: 20, 38: 2, 40: 1, 42: 6, 70: 1, 73: 1}),
    "adopt-restamp": sparse(
        91,
        {1: 1, 11: 3, 15: 4, 18: 6, 26: 1, 27: 21, 29: 1, 35: 1, 40: 1, 50: 6, 59: 6, 70: 86, 72: 94, 79: 76, 90: 70},
    ),
    "ordered-writes": sparse(
        121, {1: 2, 9: 7, 30: 17, 36: 1, 38: 1, 57: 17, 63: 1, 64: 4, 65: 1, 68: 2, 100: 94, 117: 70, 120: 5}
    ),
}


@pytest.mark.parametrize("fix", sorted(SHRUNK))
def test_a_shrunk_counterexample_still_catches_its_reverted_fix(store, fix):
    with pytest.raises(Violation):
        explore(replayed(fix, SHRUNK[fix]), store, fix)
    explore(replayed(fix, SHRUNK[fix]), store)


@pytest.mark.parametrize("fix", sorted(CATCHES))
def test_a_reverted_fix_is_caught(store, fix):
    with pytest.raises(Violation):
        explore(seeded(fix, CATCHES[fix]), store, fix)
    explore(seeded(fix, CATCHES[fix]), store)


# Hypothesis finds a reverted fix by itself, and shrinks the schedule, for the release
# slots: 2,000 derandomized examples (docs/testing.md has the measured seconds).
@pytest.mark.skipif(not LONG, reason="runs with DYNLOCK_EXPLORE=long")
def test_hypothesis_finds_and_shrinks_the_reverted_release_slots(store):
    @settings(
        max_examples=2000,
        deadline=None,
        derandomize=True,
        database=None,
        phases=[Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck),
    )
    @given(st.data())
    def schedules(data):
        explore(Choices(data), store, "release-slots")

    with pytest.raises(Violation) as found:
        schedules()
    replay = ast.literal_eval(re.search(r"replay with Choices\(replay=(\[.*?\])\)", str(found.value)).group(1))
    print(f"\nshrunk to {len(replay)} choices: {replay}")
    with pytest.raises(Violation):  # the shrunk schedule replays the bug...
        explore(Choices(replay=replay), store, "release-slots")
    explore(Choices(replay=replay), store)  # ...which the fix prevents


# Hypothesis finds the reverted ordered writes by itself too, and shrinks the schedule
# (docs/testing.md has the measured examples and seconds). Two things lead it there: a
# request held in the network, or a copy of an applied one, may land just before another
# actor's takeover of its key (Choices(ambush=True), world.RIVAL); and the search is
# guided (hypothesis.target) by how far a stale write of a holder would move its expiry
# back and how near a takeover came to a lease its holder still trusted (Ledger.rewind,
# Ledger.takeover_margin).
@pytest.mark.skipif(not LONG, reason="runs with DYNLOCK_EXPLORE=long")
def test_hypothesis_finds_and_shrinks_the_reverted_ordered_writes(store):
    fix = "ordered-writes"
    tried: list[int] = []
    found_at: list[tuple[int, float]] = []
    started = time.monotonic()

    @settings(
        max_examples=2000,
        deadline=None,
        derandomize=True,
        database=None,
        phases=[Phase.generate, Phase.target, Phase.shrink],
        suppress_health_check=list(HealthCheck),
    )
    @given(st.data())
    def schedules(data):
        tried.append(1)
        if len(tried) % 250 == 0:
            print(f"\n{fix}: {len(tried)} examples, {time.monotonic() - started:.0f}s", flush=True)
        try:
            ledger = explore(Choices(data, ambush=True), store, fix).ledger
        except Violation:
            if not found_at:
                found_at.append((len(tried), time.monotonic() - started))
            raise
        guide(ledger)

    with pytest.raises(Violation) as found:
        schedules()
    replay = ast.literal_eval(re.search(r"replay with Choices\(replay=(\[.*?\])\)", str(found.value)).group(1))
    print(
        f"\n{fix}: found at example {found_at[0][0]} after {found_at[0][1]:.0f}s; {len(tried)} examples and "
        f"{time.monotonic() - started:.0f}s with shrinking; shrunk to {len(replay)} choices, "
        f"{sum(1 for v in replay if v)} not 0: {replay}"
    )
    with pytest.raises(Violation):  # the shrunk schedule replays the bug...
        explore(Choices(replay=replay, ambush=True), store, fix)
    explore(Choices(replay=replay, ambush=True), store)  # ...which the fix prevents
