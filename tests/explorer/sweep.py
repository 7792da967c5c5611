"""Run the seeded sweep from the command line: ``python -m tests.explorer.sweep 1500``.

Prints each schedule that breaks an invariant (seed, server shape, first violation) and a
total. ``python -m tests.explorer.sweep 1500 clocks`` sweeps issue 29's world
(``Choices(clocks=True)``). ``python -m tests.explorer.sweep 1500 FIX [START]`` looks for
schedules that catch a reverted fix (reverted.py): those that break an invariant with it
reverted and pass with it, for ``CATCHES``. To compare with an older engine, run it from a
worktree of that commit with this folder copied in (how docs/reliability.md's
40-in-1,500 was measured).
"""

from __future__ import annotations

import logging
import sys
import time

import boto3
from moto import mock_aws

from localdynamo.servers import DUMMY_CREDENTIALS, DUMMY_REGION

from .scenario import Violation
from .test_explorer import explore, seeded
from .world import SeededChoices


def main(count: int, fix: str | None = None, start: int = 0) -> int:
    logging.disable(logging.CRITICAL)  # the engine's warnings, by the thousand
    broken = 0
    started = time.monotonic()
    clocks = fix == "clocks"
    reverting = None if fix in (None, "clocks") else fix
    with mock_aws():
        store = boto3.client("dynamodb", region_name=DUMMY_REGION, **DUMMY_CREDENTIALS)
        for seed in range(start, start + count):
            if seed > start and (seed - start) % 100 == 0:
                print(f"{seed - start} schedules ({time.monotonic() - started:.0f}s)", flush=True)
            choices = seeded(reverting, seed) if reverting else SeededChoices(seed, clocks=clocks)
            try:
                explore(choices, store, reverting)
            except Violation as violation:
                if reverting:
                    try:
                        explore(seeded(reverting, seed), store)
                    except Violation:
                        print(f"seed {seed}: breaks an invariant with the fix too")
                        continue
                broken += 1
                lines = str(violation).splitlines()
                print(
                    f"seed {seed}: {lines[0][:300]} ({next(line for line in lines if line.startswith('server='))})",
                    flush=True,
                )
    print(f"{broken} of {count} schedules broke an invariant ({time.monotonic() - started:.0f}s)")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(
        main(
            int(sys.argv[1]) if len(sys.argv) > 1 else 1000,
            sys.argv[2] if len(sys.argv) > 2 else None,
            int(sys.argv[3]) if len(sys.argv) > 3 else 0,
        )
    )
