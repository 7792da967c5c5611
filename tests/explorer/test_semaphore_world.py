"""The schedule explorer's semaphore world (semaphore.py): holders of one key's two slots
in virtual time, every request meeting a drawn fate; never more than two believe they hold
it, and every slot comes free at the end.

``make test`` runs a few derandomized Hypothesis examples and a schedule that must catch a
semaphore with one slot too many; ``DYNLOCK_EXPLORE=long`` runs more.
"""

from __future__ import annotations

from unittest import mock

import pytest
from hypothesis import given
from hypothesis import strategies as st

from django_dynlock.engine.semaphore import SemaphoreAcquirer
from localdynamo.servers import DUMMY_CREDENTIALS, DUMMY_REGION

from .scenario import Violation
from .semaphore import SemaphoreScenario
from .test_explorer import LONG, searching
from .world import Choices, SeededChoices

# In virtual time, and CPU-bound: on a worker at low priority (tests/conftest.py).
pytestmark = pytest.mark.background


@pytest.fixture(scope="module")
def store():
    import boto3
    from moto import mock_aws

    with mock_aws():
        yield boto3.client("dynamodb", region_name=DUMMY_REGION, **DUMMY_CREDENTIALS)


def explore(choices: Choices, store) -> SemaphoreScenario:
    """Run one schedule of the semaphore world; Violation if it breaks an invariant."""
    scenario = SemaphoreScenario(choices, store)
    ledger = scenario.run()
    if ledger.violations:
        raise Violation(
            "\n".join(ledger.violations)
            + f"\nserver={scenario.server} lease={scenario.lease}"
            + f"\nreplay with Choices(replay={choices.log!r})\n"
            + "\n".join(scenario.world.trace[-60:])
        )
    return scenario


@searching(500 if LONG else 16)
@given(st.data())
def test_no_semaphore_schedule_breaks_an_invariant(store, data):
    explore(Choices(data), store)


# A seeded schedule in which three acquisitions overlap when the engine has one slot too many.
ONE_TOO_MANY = 3


def test_the_semaphore_world_catches_one_slot_too_many(store):
    """An engine that uses limit + 1 slots lets three hold a key of limit 2: S1 fails. The
    same schedule passes as the engine is, and fills both slots at once."""
    acquisition = SemaphoreAcquirer.acquisition

    def one_more(self, key, stored, limit, *args, **kwargs):
        return acquisition(self, key, stored, limit + 1, *args, **kwargs)

    with mock.patch.object(SemaphoreAcquirer, "acquisition", one_more):
        with pytest.raises(Violation, match=r"3 holders of sem \(limit 2\) believed held at .*\(S1\)"):
            explore(SeededChoices(ONE_TOO_MANY), store)
    assert explore(SeededChoices(ONE_TOO_MANY), store).most == 2
