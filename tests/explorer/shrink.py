"""Shrink a seeded schedule that catches a reverted fix: ``python -m tests.explorer.shrink release-slots 391``.

Starts from the choices of ``SeededChoices(seed)`` (a seed of ``CATCHES``) and keeps a
smaller replay only while it still breaks an invariant with the fix reverted and passes
with it: the tail cut, then each choice lowered towards 0 (the default), until a round
changes nothing or the time budget (seconds, third argument, 900 by default) runs out.
Prints the result as ``sparse(length, {index: value})`` for ``SHRUNK``. Greedy, so not
minimal in every sense, and much cheaper than the long Hypothesis searches: for when a
change of the engine's requests shifts every recorded schedule (issue 29's first read).
"""

from __future__ import annotations

import logging
import sys
import time

import boto3
from moto import mock_aws

from localdynamo.servers import DUMMY_CREDENTIALS, DUMMY_REGION

from .scenario import Violation
from .test_explorer import explore, replayed, seeded


def breaks(store, replay: list[int], fix: str, reverted: bool) -> bool:
    try:
        explore(replayed(fix, replay), store, fix if reverted else None)
    except Violation:
        return True
    return False


def shrink(store, fix: str, replay: list[int], budget: float) -> list[int]:
    def catches(candidate: list[int]) -> bool:
        return breaks(store, candidate, fix, True) and not breaks(store, candidate, fix, False)

    if not catches(replay):
        raise SystemExit(f"the starting schedule does not catch the reverted {fix}")
    started = time.monotonic()
    changed = True
    while changed and time.monotonic() - started < budget:
        changed = False
        cut = len(replay) // 2
        while cut >= 1:  # the longest tail that can go, halving the cut
            if catches(replay[:-cut]):
                replay, changed = replay[:-cut], True
            else:
                cut //= 2
        for at in range(len(replay)):
            value = replay[at]
            for lower in sorted({0, 1, value // 2, value - 1}):
                if 0 <= lower < value and catches([*replay[:at], lower, *replay[at + 1 :]]):
                    replay, changed = [*replay[:at], lower, *replay[at + 1 :]], True
                    break
        nonzero = sum(1 for value in replay if value)
        print(f"{len(replay)} choices, {nonzero} not 0 ({time.monotonic() - started:.0f}s)", flush=True)
    return replay


def main(fix: str, seed: int, budget: float) -> int:
    logging.disable(logging.CRITICAL)  # the engine's warnings, by the thousand
    with mock_aws():
        store = boto3.client("dynamodb", region_name=DUMMY_REGION, **DUMMY_CREDENTIALS)
        choices = seeded(fix, seed)
        try:
            explore(choices, store, fix)
        except Violation:
            pass
        replay = shrink(store, fix, choices.log, budget)
    nonzero = {at: value for at, value in enumerate(replay) if value}
    print(f"sparse({len(replay)}, {nonzero})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]) if len(sys.argv) > 3 else 900.0))
