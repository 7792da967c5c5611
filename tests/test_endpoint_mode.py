"""`make test-endpoint`: the suite run against an endpoint it did not start.

The session's DynamoDB Local stands in for one started by hand: a pytest run in a child
process with DYNLOCK_TEST_ENDPOINT pointing at it must run only the tests on ``server``,
there, and leave no table of its run behind, also when a test fails; and it must not
touch tables that are not its own.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from localdynamo.servers import REPO_ROOT, dummy_client

pytestmark = [pytest.mark.slow, pytest.mark.background]

FAILING = """
from localdynamo.servers import dummy_client, table_name


def test_fails_after_making_a_table(dynlock):
    dynlock.acquire("left-held")
    assert False, "on purpose: the run's tables must go all the same"


def test_leaves_a_table_that_only_the_end_of_the_run_deletes(dynlock):
    # As a test killed before its teardown would: made under the run's prefix, not deleted.
    dummy_client(dynlock.options.endpoint_url).create_table(
        TableName=table_name(),
        KeySchema=[{"AttributeName": "k", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "k", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
"""


def run_against(endpoint: str, run: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, DYNLOCK_TEST_ENDPOINT=endpoint, DYNLOCK_TEST_RUN=run)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_run_against_an_endpoint_uses_only_it_and_deletes_its_tables(dynamodb_local_server, tmp_path):
    endpoint = dynamodb_local_server.endpoint_url
    admin = dummy_client(endpoint)
    bystander = "not-from-this-run"
    admin.create_table(
        TableName=bystander,
        KeySchema=[{"AttributeName": "k", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "k", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    failing = REPO_ROOT / "tests" / f"test_zz_endpoint_failing_{os.getpid()}.py"
    try:
        passed = run_against(
            endpoint,
            "ep1",
            "tests/test_engine.py",
            "tests/test_checks_table.py",
            "-k",
            "uncontended or create_table_is_idempotent or missing_table or bad_arguments",
        )
        assert passed.returncode == 0, passed.stdout[-3000:] + passed.stderr[-3000:]
        counts = re.search(r"(\d+) passed.*?(\d+) deselected", passed.stdout)
        assert counts and int(counts[1]) >= 2, passed.stdout[-2000:]
        assert "[endpoint]" in run_against(endpoint, "ep1", "tests/test_engine.py", "--collect-only").stdout

        failing.write_text(FAILING)
        # On xdist workers, as `make test` runs them: the controller deletes the tables once
        # every worker has finished.
        failed = run_against(endpoint, "ep2", str(failing.relative_to(REPO_ROOT)), "-n", "2")
        assert failed.returncode == 1 and "on purpose" in failed.stdout, failed.stdout[-3000:] + failed.stderr[-3000:]

        tables = admin.list_tables()["TableNames"]
        assert bystander in tables
        assert not [t for t in tables if t.startswith(("dynlock-test-ep1-", "dynlock-test-ep2-"))], tables
    finally:
        failing.unlink(missing_ok=True)
        admin.delete_table(TableName=bystander)
        admin.close()


def test_the_cost_of_a_run_counts_units_by_dynamodbs_rules():
    from localdynamo.faultproxy import RequestRecord
    from tests.support.endpoint_cost import units

    def record(operation: str, body: dict | None = None, reply_bytes: int | None = None) -> RequestRecord:
        return RequestRecord(received=0.0, operation=operation, fault=None, body=body or {}, reply_bytes=reply_bytes)

    assert units(record("UpdateItem")) == ("write", 1.0)  # also when its condition fails
    assert units(record("TransactWriteItems", {"TransactItems": [{}, {}, {}]})) == ("write", 6.0)
    assert units(record("BatchWriteItem", {"RequestItems": {"t": [{}, {}]}})) == ("write", 2.0)
    assert units(record("GetItem", {"ConsistentRead": True})) == ("read", 1.0)
    assert units(record("GetItem")) == ("read", 0.5)
    assert units(record("BatchGetItem", {"RequestItems": {"t": {"Keys": [{}, {}], "ConsistentRead": True}}})) == (
        "read",
        2.0,
    )
    assert units(record("Scan", {"ConsistentRead": True}, reply_bytes=10_000)) == ("read", 3.0)
    assert units(record("CreateTable")) is None
