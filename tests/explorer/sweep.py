"""Run the seeded sweep from the command line: ``python -m tests.explorer.sweep 1500``.

Prints each schedule that breaks an invariant (seed, server shape, first violation) and a
total. To compare with an older engine, run it from a worktree of that commit with this
folder copied in (how docs/reliability.md's 40-in-1,500 was measured).
"""

from __future__ import annotations

import logging
import sys
import time

import boto3
from moto import mock_aws

from localdynamo.servers import DUMMY_CREDENTIALS, DUMMY_REGION

from .scenario import Violation
from .test_explorer import explore
from .world import SeededChoices


def main(count: int) -> int:
    logging.disable(logging.CRITICAL)  # the engine's warnings, by the thousand
    broken = 0
    started = time.monotonic()
    with mock_aws():
        store = boto3.client("dynamodb", region_name=DUMMY_REGION, **DUMMY_CREDENTIALS)
        for seed in range(count):
            try:
                explore(SeededChoices(seed), store)
            except Violation as violation:
                broken += 1
                lines = str(violation).splitlines()
                print(f"seed {seed}: {lines[0][:200]} ({next(line for line in lines if line.startswith('server='))})")
    print(f"{broken} of {count} schedules broke an invariant ({time.monotonic() - started:.0f}s)")
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 1000))
