"""``python -m bench.moto_profile``: where moto spends its time on the library's requests.

On moto server our acquire costs several times a PutItem (``python -m bench``'s
request table); on DynamoDB Local and dynalite it does not. This runs the engine's own
acquire and release (``bench.floor.Floor``, the same expressions) against moto's
in-process ``mock_aws`` under cProfile, and splits moto's time by what it was doing.
Shares of one process's CPU, so the busy machine does not skew them much.

    python -m bench.moto_profile            # 300 acquire+release cycles
    python -m bench.moto_profile --cycles 100
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats

# (label, the moto functions whose cumulative times it adds up); no one of them calls
# another (checked with pstats' callers on moto 5.2: the item and tree copies are made
# inside the validators' set-up, and both expressions are parsed twice per request, once
# to validate the request and once to apply it)
PARTS = [
    (
        "update expression: validation (ten passes over its syntax tree, on a deep copy of it)",
        [("moto/dynamodb/parsing/validators.py", "validate"), ("moto/dynamodb/parsing/validators.py", "__init__")],
    ),
    ("update expression: parsing, twice", [("moto/dynamodb/parsing/expressions.py", "make")]),
    ("condition expression: parsing, twice", [("moto/dynamodb/comparisons.py", "parse")]),
    ("reply: serialising the returned item (ALL_NEW)", [("moto/core/serialize.py", "serialize")]),
]
TOTAL = ("moto/dynamodb/responses.py", "call_action")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=300, help="acquire+release cycles profiled (after 20 unprofiled)")
    args = parser.parse_args(argv)
    os.environ.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1")
    from moto import mock_aws

    from bench.clients import make_client
    from bench.floor import Floor
    from django_dynlock.engine.options import merge_client_config

    with mock_aws():
        client = make_client(None)
        client.create_table(wait=True)
        client.close()
        floor = Floor(None, merge_client_config(None))
        for _ in range(20):  # the item grows its slots and ring, as a lock's item does
            floor.cycle("profiled")
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(args.cycles):
            floor.cycle("profiled")
        profile.disable()
        floor.close()

    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]

    def cumulative(path: str, name: str) -> float:
        return sum(row[3] for (file, _, function), row in stats.items() if file.endswith(path) and function == name)

    total = cumulative(*TOTAL)
    print(
        f"moto's time on {args.cycles} acquire+release cycles (the engine's expressions): {total:.2f} s "
        f"under cProfile, {total / args.cycles * 1000:.1f} ms per cycle\n"
    )
    print("| what moto was doing | share of its time |\n|---|---:|")
    shares = [(label, sum(cumulative(path, name) for path, name in functions) / total) for label, functions in PARTS]
    for label, share in shares:
        print(f"| {label} | {share:.0%} |")
    print(
        f"| everything else (the request's JSON, applying the update, the table) | {1 - sum(s for _, s in shares):.0%} |"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
