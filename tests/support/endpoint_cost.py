"""``python -m tests.support.endpoint_cost URL``: what one ``make test-endpoint`` run asks of DynamoDB.

Puts a recording proxy (``localdynamo/faultproxy.py``, no faults) in front of ``URL``, a plain
``http://`` endpoint such as a DynamoDB Local you started, runs ``make test-endpoint``
through it, then counts every request the run sent, by operation, and prices them by
DynamoDB's on-demand rules (docs/testing.md, "Cost of one run against AWS"):

- a write (``PutItem``, ``UpdateItem``, ``DeleteItem``) of an item under 1 KB is one
  write request unit, also when its condition fails; ``TransactWriteItems`` two per item;
- a strongly consistent ``GetItem`` is one read request unit, an eventually consistent
  one half; ``BatchGetItem`` the same per key;
- a ``Scan`` reads its items in 4 KB units (half for eventually consistent scans): the
  reply's size stands in for the data read, an estimate;
- table and TTL requests (``CreateTable``, ``DescribeTable``, ``ListTables`` …) are free.

Afterwards it checks, at ``URL`` itself, that the run left none of its tables behind.
Exit status: that of the test run, or 1 if a table was left.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import subprocess
import sys
from typing import Any

from localdynamo.faultproxy import FaultProxy, RequestRecord
from localdynamo.servers import REPO_ROOT, dummy_client

# USD per million request units, DynamoDB on-demand, us-east-1 (since November 2024).
PRICE_PER_MILLION = {"write": 0.625, "read": 0.125}
WRITES = {"PutItem", "UpdateItem", "DeleteItem"}


def units(record: RequestRecord) -> tuple[str, float] | None:
    """("write" or "read", request units) of one request; None for a free one."""
    body: dict[str, Any] = record.body
    operation = record.operation
    consistent = 1.0 if body.get("ConsistentRead") else 0.5
    if operation in WRITES:
        return "write", 1.0
    if operation == "TransactWriteItems":
        return "write", 2.0 * len(body.get("TransactItems", []))
    if operation == "BatchWriteItem":
        return "write", float(sum(len(v) for v in body.get("RequestItems", {}).values()))
    if operation == "GetItem":
        return "read", consistent
    if operation == "BatchGetItem":
        return "read", sum(
            len(v.get("Keys", [])) * (1.0 if v.get("ConsistentRead") else 0.5)
            for v in body.get("RequestItems", {}).values()
        )
    if operation == "Scan":
        return "read", math.ceil(max(record.reply_bytes or 0, 1) / 4096) * consistent
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Count and price the requests of one `make test-endpoint` run.")
    parser.add_argument("endpoint", help="a plain http:// DynamoDB endpoint, e.g. a DynamoDB Local you run")
    parser.add_argument("--json", help="also write the counts to this file")
    args = parser.parse_args(argv)

    run = os.urandom(4).hex()
    with FaultProxy(args.endpoint, lifetime_seconds=3 * 3600, record=True) as proxy:  # no fault rates: a recorder
        env = dict(os.environ, DYNLOCK_TEST_RUN=run)
        tests = subprocess.run(
            ["make", "--no-print-directory", "test-endpoint", f"DYNLOCK_TEST_ENDPOINT={proxy.endpoint_url}"],
            cwd=REPO_ROOT,
            env=env,
        )
        log = list(proxy.log)

    requests: collections.Counter[str] = collections.Counter()
    spent: dict[str, float] = collections.defaultdict(float)
    for record in log:
        requests[record.operation] += 1
        cost = units(record)
        if cost is not None:
            spent[cost[0]] += cost[1]
    dollars = sum(spent[kind] * price / 1e6 for kind, price in PRICE_PER_MILLION.items())

    print("\n| operation | requests |\n|---|---:|")
    for operation, count in requests.most_common():
        print(f"| {operation} | {count} |")
    print(
        f"\n{sum(requests.values())} requests: {spent['write']:.0f} write request units, "
        f"{spent['read']:.0f} read request units; at on-demand prices in us-east-1 "
        f"(${PRICE_PER_MILLION['write']} / ${PRICE_PER_MILLION['read']} per million) about ${dollars:.4f}"
    )

    client = dummy_client(args.endpoint)
    try:
        left = [name for name in client.list_tables(Limit=100)["TableNames"] if f"-{run}-" in name]
    finally:
        client.close()
    print(f"tables of this run left at {args.endpoint}: {left or 'none'}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"requests": requests, "units": spent, "dollars": dollars, "tables_left": left}, out, indent=1)
    return 1 if left else tests.returncode


if __name__ == "__main__":
    sys.exit(main())
