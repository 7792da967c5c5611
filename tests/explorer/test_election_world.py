"""The schedule explorer's election world (election.py): the real ``Election`` of three
actors in virtual time, every request meeting a drawn fate, the current leader's link cut
or its process crashed. Never two leaders by their own belief, tokens increasing per term,
each loss told before the next term begins, a leader again once the network heals.

``make test`` runs a few derandomized Hypothesis examples (each takes about half a second:
the standbys' reads through moto) and a schedule that must catch a loss nobody is told
of; ``DYNLOCK_EXPLORE=long`` runs more.
"""

from __future__ import annotations

from unittest import mock

import pytest
from hypothesis import given
from hypothesis import strategies as st

from django_dynlock.engine import election as election_module
from localdynamo.servers import DUMMY_CREDENTIALS, DUMMY_REGION

from .election import ElectionScenario
from .scenario import Violation
from .test_explorer import LONG, searching
from .world import Choices, SeededChoices

# In virtual time, and CPU-bound: on a worker at low priority (tests/conftest.py).
pytestmark = pytest.mark.background

# A seeded schedule in which a term is lost (its leader's link cut past its lease) and
# another is elected: with the engine's loss events silenced, E2 must catch it.
SILENT_LOSS = 8


@pytest.fixture(scope="module")
def store():
    import boto3
    from moto import mock_aws

    with mock_aws():
        yield boto3.client("dynamodb", region_name=DUMMY_REGION, **DUMMY_CREDENTIALS)


def elect(choices: Choices, store) -> ElectionScenario:
    """Run one schedule of the election world; Violation if it breaks an invariant."""
    scenario = ElectionScenario(choices, store)
    ledger = scenario.run()
    if ledger.violations:
        raise Violation(
            "\n".join(ledger.violations)
            + f"\nserver={scenario.server} lease={scenario.lease} poll={scenario.poll}"
            + f"\nreplay with Choices(replay={choices.log!r})\n"
            + "\n".join(scenario.world.trace[-60:])
        )
    return scenario


@searching(500 if LONG else 16)
@given(st.data())
def test_no_election_schedule_breaks_an_invariant(store, data):
    elect(Choices(data), store)


def test_the_election_world_catches_a_loss_nobody_is_told_of(store):
    """With the engine's ``lost`` events kept from the elections, a leader whose term ran
    out is never told: E2 fails. The same schedule passes as the engine is."""
    with mock.patch.object(election_module, "_dispatch", lambda *args, **kwargs: None):
        with pytest.raises(Violation, match=r"told of its loss never, after term .* was elected .*\(E2\)"):
            elect(SeededChoices(SILENT_LOSS), store)
    scenario = elect(SeededChoices(SILENT_LOSS), store)
    assert len(scenario.terms) >= 2
