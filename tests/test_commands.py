"""The management commands: createlocktable, showlocks, breaklock, runlocked.

Through ``call_command`` against real servers (moto and dynalite), and as
``python manage.py ...`` subprocesses for the exit codes a shell sees.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import logging
import os
import re
import subprocess
import sys
import threading
import time
import tracemalloc
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any

import pytest
from django.core.management import BaseCommand, CommandError, call_command, get_commands

from django_dynlock import LockClient, LockLost, get_lock_client, signals
from django_dynlock.engine.items import LeaseInfo
from django_dynlock.management.commands import breaklock, showlocks
from localdynamo.servers import (
    DUMMY_CREDENTIALS,
    DUMMY_REGION,
    REPO_ROOT,
    dummy_client,
    server_env,
    start_dynalite,
    suite_region,
    table_name,
)
from tests.support.aliases import alias_settings
from tests.support.calls import count_calls
from tests.support.tools import need_dynalite

UNREACHABLE = "http://127.0.0.1:9"
# Most behaviour does not depend on the server: run it on moto only. dynalite (no TTL,
# no item on a failed condition, tables CREATING for 500 ms) keeps the core cases.
MOTO = pytest.mark.parametrize("server", ["moto"], indirect=True)
FAST_FAIL = {"connect_timeout": 0.5, "read_timeout": 1, "retries": {"total_max_attempts": 1, "mode": "standard"}}


# -- helpers ------------------------------------------------------------------------
def run(*args: Any, **options: Any) -> SimpleNamespace:
    """call_command with captured output."""
    out, err = io.StringIO(), io.StringIO()
    call_command(*args, stdout=out, stderr=err, **options)
    return SimpleNamespace(out=out.getvalue(), err=err.getvalue())


def fails(*args: Any, **options: Any) -> CommandError:
    with pytest.raises(CommandError) as caught:
        run(*args, **options)
    assert "\n" not in str(caught.value), "error messages are one line"
    return caught.value


def other_client(client: LockClient) -> LockClient:
    """A second, independent client on the same table: another process, as far as locks go."""
    return LockClient(client.options)


@pytest.fixture(scope="module")
def shared_tables() -> Iterator[dict[str, str]]:
    """One lock table per server for this module: {endpoint: table}."""
    tables: dict[str, str] = {}
    yield tables
    for endpoint, name in tables.items():
        boto = dummy_client(endpoint)
        try:
            boto.delete_table(TableName=name)
        except Exception:
            pass
        boto.close()


def empty_table(endpoint: str, name: str) -> None:
    boto = dummy_client(endpoint)
    try:
        for _ in range(100):  # pages of at most 1 MB; these tests write a few hundred items at most
            page = boto.scan(TableName=name, ProjectionExpression="#k", ExpressionAttributeNames={"#k": "key"})
            keys = [{"key": item["key"]} for item in page["Items"]]
            for start in range(0, len(keys), 25):
                boto.batch_write_item(
                    RequestItems={name: [{"DeleteRequest": {"Key": k}} for k in keys[start : start + 25]]}
                )
            if not page.get("LastEvaluatedKey"):
                break
    finally:
        boto.close()


@pytest.fixture
def dynlock(server, settings, shared_tables) -> Iterator[LockClient]:
    """Like conftest's ``dynlock``, but on a table shared by this module's tests and
    emptied after each one: creating a table per test cost more than the tests."""
    name = shared_tables.get(server.endpoint_url)
    settings.DYNLOCK = {"default": alias_settings(server.endpoint_url, name or table_name())}
    client = get_lock_client()
    if name is None:
        client.create_table(wait=True)
        shared_tables[server.endpoint_url] = client.options.table_name
    client.server = server  # type: ignore[attr-defined]
    yield client
    client.close()
    empty_table(server.endpoint_url, client.options.table_name)


@pytest.fixture
def other(dynlock) -> Iterator[LockClient]:
    client = other_client(dynlock)
    yield client
    client.close()


@pytest.fixture
def fresh(server, settings) -> Iterator[SimpleNamespace]:
    """The default alias pointing at a table that does not exist yet."""
    name = table_name()
    settings.DYNLOCK = {"default": alias_settings(server.endpoint_url, name)}
    boto = dummy_client(server.endpoint_url)
    yield SimpleNamespace(server=server, table=name, boto=boto)
    for _ in range(20):  # dynalite refuses to delete a table still CREATING
        try:
            boto.delete_table(TableName=name)
            break
        except boto.exceptions.ResourceInUseException:
            time.sleep(0.1)
        except Exception:
            break
    boto.close()


def is_dynalite(server) -> bool:
    return server.kind == "dynalite"


# -- createlocktable ------------------------------------------------------------------
def test_createlocktable_creates_the_table_with_ttl(fresh):
    result = run("createlocktable")
    assert f"Creating table {fresh.table!r}" in result.out
    assert f"at {fresh.server.endpoint_url}, region us-east-1:" in result.out  # which table (issue 14)
    assert "PAY_PER_REQUEST" in result.out and "is ACTIVE after" in result.out
    table = fresh.boto.describe_table(TableName=fresh.table)["Table"]
    assert table["KeySchema"] == [{"AttributeName": "key", "KeyType": "HASH"}]
    assert table["TableStatus"] == "ACTIVE"
    if is_dynalite(fresh.server):
        # dynalite keeps tables CREATING for 500 ms (progress) and has no TTL (warn, succeed).
        assert "waiting for ACTIVE: CREATING" in result.out
        assert "has no TTL API" in result.err and "Warning:" in result.err
    else:
        assert "TTL enabled on 'gc_at'" in result.out and result.err == ""
        ttl = fresh.boto.describe_time_to_live(TableName=fresh.table)["TimeToLiveDescription"]
        assert ttl == {"TimeToLiveStatus": "ENABLED", "AttributeName": "gc_at"}
    get_lock_client().acquire("works").release()


def test_createlocktable_is_idempotent(dynlock):
    result = run("createlocktable")
    assert f"Table {dynlock.options.table_name!r} already exists" in result.out
    assert "right key schema (ACTIVE, PAY_PER_REQUEST)" in result.out


def test_createlocktable_enables_ttl_on_an_existing_table(moto_server, settings):
    name = table_name()
    boto = dummy_client(moto_server.endpoint_url)
    boto.create_table(
        TableName=name,
        BillingMode="PAY_PER_REQUEST",
        KeySchema=[{"AttributeName": "key", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "key", "AttributeType": "S"}],
    )
    settings.DYNLOCK = {"default": alias_settings(moto_server.endpoint_url, name)}
    result = run("createlocktable")
    assert "already exists" in result.out and "TTL enabled on 'gc_at'" in result.out
    assert boto.describe_time_to_live(TableName=name)["TimeToLiveDescription"]["TimeToLiveStatus"] == "ENABLED"
    assert "TTL already enabled on 'gc_at'" in run("createlocktable").out
    boto.delete_table(TableName=name)
    boto.close()


def test_createlocktable_warns_when_ttl_is_on_another_attribute(moto_server, settings):
    name = table_name()
    boto = dummy_client(moto_server.endpoint_url)
    boto.create_table(
        TableName=name,
        BillingMode="PAY_PER_REQUEST",
        KeySchema=[{"AttributeName": "key", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "key", "AttributeType": "S"}],
    )
    boto.update_time_to_live(TableName=name, TimeToLiveSpecification={"Enabled": True, "AttributeName": "ttl"})
    settings.DYNLOCK = {"default": alias_settings(moto_server.endpoint_url, name)}
    result = run("createlocktable")
    assert "has TTL on 'ttl', not on 'gc_at'" in result.err
    boto.delete_table(TableName=name)
    boto.close()


def test_createlocktable_refuses_a_table_with_the_wrong_key_schema(fresh):
    fresh.boto.create_table(
        TableName=fresh.table,
        BillingMode="PAY_PER_REQUEST",
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "sk", "AttributeType": "S"},
        ],
    )
    error = fails("createlocktable")
    assert error.returncode == 3
    assert "wrong key schema: partition key is 'pk', expected 'key'" in str(error)


def test_createlocktable_provisioned(fresh):
    result = run("createlocktable", "--billing-mode", "PROVISIONED", "--read", "2", "--write", "3")
    assert "PROVISIONED (read 2, write 3)" in result.out
    table = fresh.boto.describe_table(TableName=fresh.table)["Table"]
    throughput = table["ProvisionedThroughput"]
    assert (throughput["ReadCapacityUnits"], throughput["WriteCapacityUnits"]) == (2, 3)
    # Asking for another billing mode later does not change an existing table: it says so.
    again = run("createlocktable", "--billing-mode", "pay_per_request")
    assert "already exists" in again.out and "--billing-mode PAY_PER_REQUEST was not applied" in again.err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--billing-mode", "PROVISIONED"], "needs --read N and --write N"),
        (["--billing-mode", "PROVISIONED", "--read", "1"], "needs --read N and --write N"),
        (["--read", "1", "--write", "1"], "only apply with --billing-mode PROVISIONED"),
        (["--billing-mode", "PROVISIONED", "--read", "0", "--write", "1"], "expected a whole number >= 1"),
        (["--billing-mode", "SOMETIMES"], "invalid choice"),
        (["--timeout", "0"], "expected a number of seconds > 0"),
        (["--print", "yaml"], "invalid choice"),
    ],
)
def test_createlocktable_bad_arguments(settings, args, message):
    settings.DYNLOCK = {"default": alias_settings(UNREACHABLE, "never-created")}
    error = fails("createlocktable", *args)
    assert error.returncode == 2 and message in str(error)


def test_createlocktable_no_wait(fresh):
    result = run("createlocktable", "--no-wait")
    if is_dynalite(fresh.server):
        assert "Not waiting (--no-wait)" in result.out and "is CREATING" in result.out
        assert "waiting for ACTIVE" not in result.out
    else:  # moto creates tables ACTIVE at once, so TTL is enabled right away
        assert "TTL enabled on 'gc_at'" in result.out


def test_createlocktable_timeout(settings):
    # A dynalite of its own whose tables stay CREATING for 2 s: no race with a slow machine.
    need_dynalite()
    with start_dynalite(extra_args=["--createTableMs", "2000"]) as slow:
        name = table_name()
        settings.DYNLOCK = {"default": alias_settings(slow.endpoint_url, name)}
        error = fails("createlocktable", "--timeout", "0.2")
        assert error.returncode == 3 and f"table {name!r} is still CREATING after 0.2s" in str(error)
        again = run("createlocktable", "--timeout", "10").out  # a re-run finishes the job
        assert "already exists" in again and "waiting for ACTIVE: CREATING" in again and "is ACTIVE after" in again


def test_createlocktable_verbosity_0_is_quiet(fresh):
    result = run("createlocktable", verbosity=0)
    assert result.out == ""


def printed(*args: str) -> str:
    return run("createlocktable", "--print", *args).out


def test_createlocktable_print_calls_nothing(settings):
    # An endpoint nobody listens on: --print must not need it.
    settings.DYNLOCK = {"default": alias_settings(UNREACHABLE, "locks-as-code", KEY_ATTRIBUTE="pk", TTL_ATTRIBUTE="on")}
    everything = printed()
    assert "# CreateTable request" in everything and "update-time-to-live" in everything
    assert "Type: AWS::DynamoDB::Table" in everything
    assert json.loads(printed("create-table")) == {
        "TableName": "locks-as-code",
        "KeySchema": [{"AttributeName": "pk", "KeyType": "HASH"}],
        "AttributeDefinitions": [{"AttributeName": "pk", "AttributeType": "S"}],
        "BillingMode": "PAY_PER_REQUEST",
    }
    assert json.loads(printed("ttl")) == {
        "TableName": "locks-as-code",
        "TimeToLiveSpecification": {"Enabled": True, "AttributeName": "on"},
    }
    provisioned = json.loads(printed("create-table", "--billing-mode", "PROVISIONED", "--read", "4", "--write", "5"))
    assert provisioned["ProvisionedThroughput"] == {"ReadCapacityUnits": 4, "WriteCapacityUnits": 5}
    import yaml

    stack = yaml.safe_load(printed("cloudformation"))
    properties = stack["Resources"]["DynLockTable"]["Properties"]
    # "on" is quoted: unquoted YAML would read it as the boolean true.
    assert properties["TimeToLiveSpecification"] == {"AttributeName": "on", "Enabled": True}


def test_createlocktable_print_requests_make_a_working_table(moto_server, settings):
    name = table_name()
    settings.DYNLOCK = {"default": alias_settings(moto_server.endpoint_url, name)}
    boto = dummy_client(moto_server.endpoint_url)
    boto.create_table(**json.loads(printed("create-table")))
    boto.update_time_to_live(**json.loads(printed("ttl")))
    assert run("check", "--deploy", "--tag", "dynlock_table", "--fail-level", "WARNING").err == ""
    get_lock_client().acquire("k").release()
    boto.delete_table(TableName=name)
    boto.close()


def test_createlocktable_print_cloudformation_makes_a_working_table(moto_server, settings):
    import boto3
    from django.core import checks

    name = table_name()
    settings.DYNLOCK = {"default": alias_settings(moto_server.endpoint_url, name)}
    template = printed("cloudformation")
    cloudformation = boto3.client(
        "cloudformation",
        endpoint_url=moto_server.endpoint_url,
        region_name=DUMMY_REGION,
        **DUMMY_CREDENTIALS,
    )
    cloudformation.create_stack(StackName=f"stack-{name}", TemplateBody=template)
    ids = [m.id for m in checks.run_checks(tags=["dynlock_table"], include_deployment_checks=True)]
    assert ids in ([], ["dynlock.W101"])  # moto's CloudFormation ignores TimeToLiveSpecification
    get_lock_client().acquire("k").release()
    cloudformation.close()


@pytest.mark.slow
@pytest.mark.parametrize("billing", [[], ["--billing-mode", "PROVISIONED", "--read", "1", "--write", "1"]])
def test_createlocktable_print_cloudformation_passes_cfn_lint(settings, billing):
    # What moto skips, CloudFormation's resource schema checks (cfn-lint comes with moto[server]).
    cfnlint = pytest.importorskip("cfnlint.api")
    settings.DYNLOCK = {"default": alias_settings(UNREACHABLE, "locks-as-code")}
    problems = [m for m in cfnlint.lint_all(printed("cloudformation", *billing)) if m.rule.id[0] in "EW"]
    assert problems == []


# -- showlocks ------------------------------------------------------------------------
def test_showlocks_without_leases(dynlock):
    # issue 14: the table and the region are named (two regions, two tables)
    table = f"in table {dynlock.options.table_name!r} at {dynlock.server.endpoint_url}, region {suite_region()}"
    assert run("showlocks").out == f"No live leases {table}.\n"
    assert run("showlocks", "--prefix", "job:").out == f"No live leases with prefix 'job:' {table}.\n"
    assert run("showlocks", "--all").out == f"No leases {table}.\n"
    assert json.loads(run("showlocks", "--format", "json").out) == []
    assert run("showlocks", "--format", "csv").out.splitlines() == [",".join(showlocks.listing.CSV_FIELDS)]


def test_showlocks_table(dynlock, other):
    lease = other.acquire("invoice:42", holder={"view": "shop.views.pay", "user": "42", "job": "7"})
    out = run("showlocks").out
    header, row, where = out.splitlines()
    assert header.split() == ["KEY", "TOKEN", "HOLDER", "ACQUIRED", "EXPIRES", "METADATA"]
    assert where == f"1 live lease in table {dynlock.options.table_name!r} at {dynlock.where()}."
    assert row.startswith("invoice:42  ")
    assert str(lease.token) in row
    assert f"shop.views.pay (user 42) on {os.uname().nodename}:{os.getpid()}" in row
    assert re.search(r" [0-9.]+s ago +in [0-9]+s ", row)
    assert row.endswith("job=7")
    lease.release()


@MOTO
def test_showlocks_json_and_csv(dynlock, other):
    lease = other.acquire("report:1", lease=8.0, holder={"function": "reports.build"})
    [record] = json.loads(run("showlocks", "--format", "json").out)
    assert record["key"] == "report:1" and record["token"] == lease.token and record["state"] == "held"
    assert record["holder"] == {"function": "reports.build"} and record["pid"] == os.getpid()
    assert record["lease_seconds"] == 8.0 and 0 < record["expires_in"] <= 8.0 + dynlock.clock.uncertainty()
    assert dt.datetime.fromisoformat(record["acquired_at"]).tzinfo is not None
    [row] = list(csv.DictReader(io.StringIO(run("showlocks", "--format", "csv").out)))
    assert row["key"] == "report:1" and int(row["token"]) == lease.token
    assert json.loads(row["holder"]) == {"function": "reports.build"}
    assert row["released_at"] == ""
    lease.release()


FORMULAS = ["=1+1", '=HYPERLINK("http://evil.example/","open")', "+1", "-1", "@SUM(A1)", "\tx", "\rx"]


@MOTO
def test_showlocks_csv_cells_that_a_spreadsheet_would_run_are_text(dynlock, other):
    # issue 14: keys and reasons are written raw; `=1+1` or `=HYPERLINK(...)` became a formula.
    leases = [other.acquire(key, holder={"note": "=2+2"}) for key in FORMULAS]
    assert dynlock.break_lease("-1", reason="@cmd|' /C calc'!A0")
    rows = list(csv.DictReader(io.StringIO(run("showlocks", "--format", "csv", "--all").out)))
    by_key = {row["key"]: row for row in rows}
    assert sorted(by_key) == sorted("'" + key for key in FORMULAS)
    assert by_key["'-1"]["break_reason"] == "'@cmd|' /C calc'!A0"
    for row in rows:
        assert json.loads(row["holder"]) == {"note": "=2+2"}  # a JSON object: starts with {
        assert not [v for v in row.values() if v.startswith(showlocks.listing.FORMULA_STARTS)], row
        assert int(row["token"]) > 0  # numbers stay numbers
    for lease in leases:
        if lease.key == "-1":
            with pytest.raises(LockLost):
                lease.release()
        else:
            lease.release()


@MOTO
def test_showlocks_prefix(dynlock, other):
    leases = [other.acquire(key) for key in ("job:a", "job:b", "user:1")]
    out = run("showlocks", "--prefix", "job:").out
    assert "job:a" in out and "job:b" in out and "user:1" not in out
    keys = [r["key"] for r in json.loads(run("showlocks", "--format", "json", "--prefix", "user:").out)]
    assert keys == ["user:1"]
    for lease in leases:
        lease.release()


def test_showlocks_all_shows_released_broken_and_expired(dynlock, other):
    other.acquire("released").release()
    other.acquire("broken")
    dynlock.break_lease("broken", reason="stuck")
    other.acquire("expired").keep_for(0.2)  # a holder that stopped renewing
    held = other.acquire("held")
    # Past its expiry by DynamoDB's clock, whatever either client does not know of that clock.
    time.sleep(0.25 + other.clock.uncertainty() + dynlock.clock.uncertainty())

    live = run("showlocks").out
    assert "held" in live and "released" not in live and "expired" not in live.split("\n")[1]
    assert "(1 expired lease not shown" in live and "--all shows them" in live

    everything = run("showlocks", "--all").out
    *rows, where = everything.splitlines()[1:]
    states = {line.split()[0]: line.split()[1] for line in rows}
    assert where.startswith("4 leases in table ")
    assert states == {"released": "released", "broken": "broken", "expired": "expired", "held": "held"}
    assert re.search(r"  expired [0-9.]+s ago$", everything, re.MULTILINE)  # the EXPIRES column

    records = {r["key"]: r for r in json.loads(run("showlocks", "--all", "--format", "json").out)}
    assert records["broken"]["break_reason"] == "stuck" and records["broken"]["released_by"].startswith("break:")
    assert records["released"]["expires_in"] is None and records["released"]["released_at"]
    held.release()


def test_showlocks_streams_pages(dynlock):
    # 130 held items written directly: pages of 50 are three Scan calls.
    now = time.time()
    items = [
        {
            "key": {"S": f"bulk:{i:03d}"},
            "owner": {"S": f"h:1:c:{i}"},
            "fence": {"N": str(i + 1)},
            "lease_ms": {"N": "30000"},
            "expires_at": {"N": str(now + 30)},
            "acquired_at": {"N": str(now)},
            "host": {"S": "h"},
            "pid": {"N": "1"},
            "holder": {"M": {}},
        }
        for i in range(130)
    ]
    for start in range(0, len(items), 25):
        dynlock.boto.batch_write_item(
            RequestItems={
                dynlock.options.table_name: [{"PutRequest": {"Item": item}} for item in items[start : start + 25]]
            }
        )
    with count_calls(dynlock) as calls:
        records = json.loads(run("showlocks", "--format", "json", "--page-size", "50").out)
    assert sorted(r["key"] for r in records) == [f"bulk:{i:03d}" for i in range(130)]
    assert calls["Scan"] == 3
    assert len(run("showlocks", "--page-size", "50").out.splitlines()) == 132  # header, rows, which table


class CountingSink(io.TextIOBase):
    """A stdout that keeps nothing: what is measured is the command's own memory."""

    def __init__(self) -> None:
        self.lines = 0
        self.chars = 0

    def write(self, text: str) -> int:
        self.lines += text.count("\n")
        self.chars += len(text)
        return len(text)


def synthetic_leases(count: int) -> Iterator[LeaseInfo]:
    now = dt.datetime.now(dt.UTC)
    for i in range(count):
        yield LeaseInfo(
            key=f"k:{i:06d}",
            stored_key=f"k:{i:06d}",
            token=i,
            owner=f"h:1:c:{i}",
            rvn="r",
            lease_seconds=30.0,
            expires_at=now + dt.timedelta(seconds=30),
            acquired_at=now,
            host="web-1",
            pid=i,
            holder={"view": "v", "n": str(i)},
        )


@pytest.fixture
def synthetic(settings, monkeypatch) -> Iterator[Any]:
    """Replace the paginated Scan (tested above) by a generator of made-up leases."""
    settings.DYNLOCK = {"default": alias_settings(UNREACHABLE, "synthetic")}
    client = get_lock_client()
    client.boto  # noqa: B018 (built here, as a real run builds it for its first Scan)

    def use(generator_factory: Any) -> None:
        monkeypatch.setattr(client, "leases", lambda *args, **kwargs: generator_factory())

    yield use


@pytest.mark.parametrize("fmt", ["table", "json", "csv"])
def test_showlocks_writes_each_lease_before_reading_more(synthetic, fmt):
    # The table holds back its first rows to size the columns; after that, and in
    # json and csv from the start, a lease is written before the next one is read.
    sink = CountingSink()
    behind = showlocks.listing.WIDTH_SAMPLE if fmt == "table" else 0

    def leases() -> Iterator[LeaseInfo]:
        for n, info in enumerate(synthetic_leases(3_000)):
            assert sink.lines >= n - behind, f"lease {n} read before lease {n - behind - 1} was written"
            yield info

    synthetic(leases)
    call_command("showlocks", "--format", fmt, stdout=sink, stderr=io.StringIO())
    assert sink.lines >= 3_000


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["table", "json", "csv"])
def test_showlocks_uses_constant_memory_for_100_000_leases(synthetic, fmt):
    synthetic(lambda: synthetic_leases(100_000))
    sink = CountingSink()
    tracemalloc.start()
    try:
        call_command("showlocks", "--format", fmt, stdout=sink, stderr=io.StringIO())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert sink.lines >= 100_000
    assert peak < 2_000_000, f"peak {peak} bytes: the output is not streamed"


@MOTO
def test_showlocks_watch(dynlock, other):
    lease = other.acquire("watched")
    out = run("showlocks", "--watch", "0.01", "--iterations", "3").out
    assert out.count("Every 0.01s: showlocks --alias default") == 3
    assert out.count("watched") == 3
    documents = run("showlocks", "--watch", "0.01", "--iterations", "2", "--format", "json").out
    arrays, at = [], 0  # one JSON array per refresh, nothing in between
    while at < len(documents):
        array, at = json.JSONDecoder().raw_decode(documents, at)
        arrays.append([record["key"] for record in array])
        at += 1  # the newline after it
    assert arrays == [["watched"], ["watched"]]
    lease.release()


@MOTO
def test_showlocks_watch_ends_quietly_on_ctrl_c(dynlock, monkeypatch):
    def interrupt(seconds: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(showlocks, "sleep", interrupt)
    out = run("showlocks", "--watch", "5").out  # no --iterations: only Ctrl-C ends it
    assert out.count("Every 5s") == 1


@pytest.mark.parametrize(
    "args, message",
    [
        (["--iterations", "2"], "--iterations only applies with --watch"),
        (["--watch", "0"], "expected a number of seconds > 0"),
        (["--watch", "nan"], "expected a finite number of seconds"),
        (["--watch", "1", "--iterations", "0"], "expected a whole number >= 1"),
        (["--format", "xml"], "invalid choice"),
        (["--page-size", "0"], "expected a whole number >= 1"),
    ],
)
def test_showlocks_bad_arguments(settings, args, message):
    settings.DYNLOCK = {"default": alias_settings(UNREACHABLE, "never-created")}
    error = fails("showlocks", *args)
    assert error.returncode == 2 and message in str(error)


# -- breaklock ------------------------------------------------------------------------
@pytest.fixture
def broken_signals() -> Iterator[list[dict]]:
    received: list[dict] = []

    def receiver(sender: Any, **kwargs: Any) -> None:
        received.append(kwargs)

    signals.lock_broken.connect(receiver)
    yield received
    signals.lock_broken.disconnect(receiver)


@MOTO
@pytest.mark.parametrize("flag", ["--noinput", "--no-input"])
def test_breaklock_noinput(dynlock, other, broken_signals, caplog, flag):
    lease = other.acquire("stuck", holder={"command": "import_feed"})
    caplog.set_level(logging.WARNING)
    result = run("breaklock", "stuck", flag, "--reason", "import hung")
    assert f"stuck: token {lease.token}, held by import_feed on" in result.out
    assert f"stuck: broken (token {lease.token})" in result.out
    assert dynlock.get("stuck") is None
    [info] = [i for i in dynlock.leases(include_released=True) if i.key == "stuck"]
    assert info.was_broken and info.break_reason == "import hung"
    assert info.released_by.endswith("(breaklock)") and "@" in info.released_by
    [sent] = broken_signals
    assert sent["key"] == "stuck" and sent["token"] == lease.token and sent["reason"] == "import hung"
    assert sent["by"] == info.released_by[len("break:") :]
    audit = [r.getMessage() for r in caplog.records if r.name == "django_dynlock.management"]
    assert len(audit) == 1 and sent["by"] in audit[0] and "import_feed" in audit[0] and "import hung" in audit[0]
    other.close()  # its lease was broken under it


def test_breaklock_several_keys_some_missing(dynlock, other):
    other.acquire("a"), other.acquire("b")
    error = fails("breaklock", "a", "missing", "b", "--noinput")
    assert error.returncode == 1 and "1 of 3 locks not broken: 'missing'" in str(error)
    assert dynlock.get("a") is None and dynlock.get("b") is None


@MOTO
def test_breaklock_output_lines(dynlock, other):
    lease = other.acquire("a")
    out = io.StringIO()
    with pytest.raises(CommandError):
        call_command("breaklock", "a", "missing", "--noinput", stdout=out)
    shown, broken, missing = out.getvalue().splitlines()
    assert shown.startswith(f"a: token {lease.token}, held by {os.uname().nodename}:{os.getpid()}, acquired ")
    assert broken == f"a: broken (token {lease.token})"
    assert missing == "missing: not broken: not found: no live lease or reservation on this key"


@MOTO
def test_breaklock_token(dynlock, other):
    lease = other.acquire("t")
    error = fails("breaklock", "t", "--token", str(lease.token + 1), "--noinput")
    assert error.returncode == 1 and dynlock.get("t") is not None
    run("breaklock", "t", "--token", str(lease.token), "--noinput")
    assert dynlock.get("t") is None


@MOTO
def test_breaklock_token_is_for_one_key(dynlock):
    error = fails("breaklock", "a", "b", "--token", "3", "--noinput")
    assert error.returncode == 2 and "--token applies to one KEY" in str(error)


@MOTO
@pytest.mark.parametrize("key", ["", "x" * 3000])
def test_breaklock_invalid_key(dynlock, key):
    assert fails("breaklock", key, "--noinput").returncode == 2


@MOTO
@pytest.mark.parametrize("answer, broken", [("y", True), ("YES", True), ("n", False), ("", False), (EOFError, False)])
def test_breaklock_asks(dynlock, other, monkeypatch, answer, broken):
    other.acquire("ask")
    prompts: list[str] = []

    def fake_input(prompt: str) -> str:
        prompts.append(prompt)
        if answer is EOFError:
            raise EOFError
        return answer

    monkeypatch.setattr(breaklock, "stdin_is_interactive", lambda: True)
    monkeypatch.setattr("builtins.input", fake_input)
    if broken:
        run("breaklock", "ask")
    else:
        assert fails("breaklock", "ask").returncode == 1
    assert prompts == ["Break the lease on 'ask'? [y/N] "]
    assert (dynlock.get("ask") is None) == broken


@MOTO
def test_breaklock_does_not_break_a_lease_that_changed_hands_while_asking(dynlock, other, monkeypatch):
    first = other.acquire("moving")

    def hand_over(prompt: str) -> str:
        first.release()
        other.acquire("moving")  # a new holder, a new token
        return "y"

    monkeypatch.setattr(breaklock, "stdin_is_interactive", lambda: True)
    monkeypatch.setattr("builtins.input", hand_over)
    out = io.StringIO()
    with pytest.raises(CommandError) as caught:
        call_command("breaklock", "moving", stdout=out)
    assert caught.value.returncode == 1
    assert "moving: not broken: gone: released or taken over since it was shown" in out.getvalue()
    assert dynlock.get("moving").token > first.token


@MOTO
def test_breaklock_without_a_terminal_needs_noinput(dynlock, monkeypatch):
    monkeypatch.setattr(breaklock, "stdin_is_interactive", lambda: False)
    error = fails("breaklock", "k")
    assert error.returncode == 2 and "pass --noinput" in str(error)


# -- runlocked ------------------------------------------------------------------------
class Probe(BaseCommand):
    """An inner command that reports what it saw while running under runlocked."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[dict[str, Any]] = []

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--key", default="k")
        parser.add_argument("--exit", type=int)
        parser.add_argument("--sys-exit", type=int)
        parser.add_argument("--crash", action="store_true")
        parser.add_argument("--sleep", type=float, default=0.0)
        parser.add_argument("--break-own-lock", action="store_true")
        parser.add_argument("--interrupt", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        client = get_lock_client()
        lease = self.dynlock_lease
        self.seen.append({"lease": lease, "info": client.get(options["key"])})
        time.sleep(options["sleep"])
        self.seen[-1]["held_at_end"] = lease.is_held
        self.stdout.write("probe ran")
        if options["break_own_lock"]:
            breaker = other_client(client)
            breaker.break_lease(options["key"], reason="test")
            breaker.close()
        if options["exit"] is not None:
            raise CommandError("probe failed", returncode=options["exit"])
        if options["sys_exit"] is not None:
            sys.exit(options["sys_exit"])
        if options["crash"]:
            raise ValueError("probe crashed")
        if options["interrupt"]:
            raise KeyboardInterrupt


@pytest.fixture
def probe(monkeypatch) -> Probe:
    command = Probe()
    monkeypatch.setitem(get_commands(), "dynlock_probe", command)
    return command


def test_runlocked_runs_the_command_under_the_lease(dynlock, probe):
    result = run("runlocked", "cron:probe", "--", "dynlock_probe", "--key", "cron:probe")
    assert result.out == "probe ran\n"
    [seen] = probe.seen
    info = seen["info"]
    assert info.token == seen["lease"].token and info.holder == {"command": "dynlock_probe"}
    assert info.host == os.uname().nodename and info.pid == os.getpid()
    assert info.lease_seconds == dynlock.options.lease_duration
    assert dynlock.get("cron:probe") is None  # released afterwards


@MOTO
def test_runlocked_without_separator_and_options_before_it(dynlock, probe):
    run("runlocked", "k", "dynlock_probe")
    run("runlocked", "--wait", "0.5", "k", "--lease", "5", "--", "dynlock_probe")
    assert [s["info"].lease_seconds for s in probe.seen] == [dynlock.options.lease_duration, 5.0]


@MOTO
def test_runlocked_heartbeats_while_the_command_runs(dynlock, probe):
    run("runlocked", "k", "--lease", "1.0", "--", "dynlock_probe", "--sleep", "1.5")
    assert probe.seen[0]["held_at_end"]  # renewed every 0.33 s for longer than the lease


def test_runlocked_busy_skips(dynlock, other, probe):
    held = other.acquire("k", holder={"command": "dynlock_probe"})
    result = run("runlocked", "k", "--", "dynlock_probe")
    assert result.out.startswith(f"Skipped: lock 'k' is busy (token {held.token}, held by dynlock_probe on ")
    assert probe.seen == []
    assert run("runlocked", "k", "--", "dynlock_probe", verbosity=0).out == ""
    error = fails("runlocked", "k", "--busy-exit", "75", "--", "dynlock_probe")
    assert error.returncode == 75 and "Skipped: lock 'k' is busy" in str(error)
    held.release()


@MOTO
def test_runlocked_waits(dynlock, other, probe):
    held = other.acquire("k")
    timer = threading.Timer(0.3, held.release)
    timer.start()
    try:
        assert run("runlocked", "k", "--wait", "5", "--", "dynlock_probe").out == "probe ran\n"
    finally:
        timer.cancel()


@MOTO
def test_runlocked_at_least_keeps_the_lock(dynlock, other, probe):
    started = time.monotonic()
    result = run("runlocked", "k", "--at-least", "1.0", "--", "dynlock_probe")
    assert result.err == "" and time.monotonic() - started < 1.0  # exits at once, the lease stays
    assert other.try_acquire("k") is None  # another host's run of the same minute skips
    client = get_lock_client()
    kept = client.get("k")
    left = kept.expires_in(client.server_datetime())
    # Stamped by the latest DynamoDB's clock could read: up to our uncertainty about it later.
    assert 0 < kept.lease_seconds <= 1.0 and 0 < left <= 1.0 + client.clock.uncertainty()
    # Any later run takes it once the kept expiry has passed by DynamoDB's clock.
    assert run("runlocked", "k", "--wait", "4", "--", "dynlock_probe").out == "probe ran\n"
    assert time.monotonic() - started >= 1.0
    assert len(probe.seen) == 2


@MOTO
def test_runlocked_at_least_shorter_than_the_run_releases(dynlock, other, probe):
    run("runlocked", "k", "--at-least", "0.1", "--", "dynlock_probe", "--sleep", "0.2")
    assert other.try_acquire("k") is not None


@MOTO
def test_runlocked_takes_over_a_holder_that_stopped_renewing(dynlock, other, probe):
    other.acquire("k").keep_for(0.2)  # as a crashed holder leaves it, with a short lease
    started = time.monotonic()
    # A one-shot run with no --wait: each try is one acquire, taken once the expiry passed.
    for _ in range(40):
        if run("runlocked", "k", "--", "dynlock_probe").out == "probe ran\n":
            break
        time.sleep(0.1)
    assert len(probe.seen) == 1
    assert time.monotonic() - started < 0.2 + 3.0


@MOTO
def test_runlocked_ctrl_c_releases_at_once(dynlock, other, probe):
    with pytest.raises(KeyboardInterrupt):
        run("runlocked", "k", "--at-least", "30", "--", "dynlock_probe", "--interrupt")
    assert other.try_acquire("k") is not None


@MOTO
def test_runlocked_passes_the_exit_code_through(dynlock, probe):
    error = fails("runlocked", "k", "--", "dynlock_probe", "--exit", "5")
    assert error.returncode == 5 and str(error) == "probe failed"
    with pytest.raises(SystemExit) as caught:
        run("runlocked", "k", "--", "dynlock_probe", "--sys-exit", "7")
    assert caught.value.code == 7
    with pytest.raises(ValueError, match="probe crashed"):
        run("runlocked", "k", "--", "dynlock_probe", "--crash")
    assert len(probe.seen) == 3 and dynlock.get("k") is None  # released every time


@MOTO
def test_runlocked_reports_a_lease_lost_during_the_run(dynlock, probe):
    result = run("runlocked", "k", "--", "dynlock_probe", "--break-own-lock")
    assert result.out == "probe ran\n"
    assert "Warning: the lock ended before the run finished" in result.err and "broken" in result.err


@MOTO
@pytest.mark.parametrize(
    "args, message",
    [
        (["k"], "no command to run"),
        (["k", "--"], "no command to run"),
        (["k", "--", "nosuchcommand"], "unknown command 'nosuchcommand'"),
        (["k", "--", "dynlock_probe", "--bogus"], "dynlock_probe: Error: unrecognized arguments: --bogus"),
        (["k", "dynlock_probe", "--", "dynlock_probe"], "give the command after -- only"),
        (["k", "--wait", "-1", "--", "dynlock_probe"], "expected a finite number of seconds >= 0"),
        (["k", "--lease", "0", "--", "dynlock_probe"], "expected a number of seconds > 0"),
        (["k", "--busy-exit", "300", "--", "dynlock_probe"], "expected an exit code 0-255"),
        (["", "--", "dynlock_probe"], "key"),
    ],
)
def test_runlocked_bad_arguments_take_no_lock(dynlock, probe, args, message):
    error = fails("runlocked", *args)
    assert error.returncode == 2 and message in str(error)
    assert probe.seen == [] and list(dynlock.leases(include_released=True)) == []


@MOTO
def test_every_command_uses_the_alias_it_is_given(dynlock, settings):
    reports = table_name()
    settings.DYNLOCK = {**settings.DYNLOCK, "reports": alias_settings(dynlock.server.endpoint_url, reports)}
    assert f"Creating table {reports!r}" in run("createlocktable", "--alias", "reports").out
    lease = get_lock_client("reports").acquire("report:1")
    get_lock_client().acquire("default:1").release()
    assert [r["key"] for r in json.loads(run("showlocks", "--alias", "reports", "--format", "json").out)] == [
        "report:1"
    ]
    run("breaklock", "--alias", "reports", "report:1", "--noinput")
    assert not lease.is_held  # same process: it learns at once
    get_lock_client("reports").close()
    dummy_client(dynlock.server.endpoint_url).delete_table(TableName=reports)


@MOTO
def test_runlocked_alias(dynlock, probe, settings):
    other_table = table_name()
    settings.DYNLOCK = {**settings.DYNLOCK, "reports": alias_settings(dynlock.server.endpoint_url, other_table)}
    get_lock_client("reports").create_table()
    run("runlocked", "--alias", "reports", "k", "--", "dynlock_probe")
    assert [i.key for i in get_lock_client("reports").leases(include_released=True)] == ["k"]
    assert list(get_lock_client().leases(include_released=True)) == []
    dummy_client(dynlock.server.endpoint_url).delete_table(TableName=other_table)


# -- errors shared by every command -------------------------------------------------
COMMANDS = [
    ["createlocktable"],
    ["showlocks"],
    ["breaklock", "k", "--noinput"],
    ["runlocked", "k", "--", "check"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_unknown_alias(settings, command):
    settings.DYNLOCK = {"default": alias_settings(UNREACHABLE, "ttt"), "reports": alias_settings(UNREACHABLE, "ttt")}
    error = fails(command[0], "--alias", "nope", *command[1:])
    assert error.returncode == 2 and str(error) == "unknown alias 'nope': DYNLOCK defines 'default', 'reports'"


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_misconfigured_alias(settings, command):
    settings.DYNLOCK = {"default": {**alias_settings(UNREACHABLE, "ttt"), "LEASE_DURATION": "long"}}
    error = fails(*command)
    assert error.returncode == 2 and "dynlock.E005" in str(error)


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_unreachable_endpoint(settings, command):
    settings.DYNLOCK = {"default": alias_settings(UNREACHABLE, "ttt", CLIENT_CONFIG=FAST_FAIL)}
    error = fails(*command)
    assert error.returncode == 3 and "could not connect to DynamoDB at http://127.0.0.1:9" in str(error)


@pytest.mark.parametrize("command", COMMANDS[1:], ids=lambda c: c[0])
def test_missing_table(server, settings, command):
    settings.DYNLOCK = {"default": alias_settings(server.endpoint_url, table_name())}
    error = fails(*command)
    assert error.returncode == 3 and "does not exist" in str(error) and "createlocktable" in str(error)


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_missing_credentials(moto_server, settings, monkeypatch, command):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    settings.DYNLOCK = {"default": alias_settings(moto_server.endpoint_url, "ttt", SESSION_OPTIONS={})}
    error = fails(*command)
    assert error.returncode == 3 and "no AWS credentials found" in str(error)


class DenyAll(BaseHTTPRequestHandler):
    """A DynamoDB endpoint that answers every request with AccessDeniedException."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        body = json.dumps(
            {
                "__type": "com.amazonaws.dynamodb.v20120810#AccessDeniedException",
                "message": "User: arn:aws:iam::1:user/ci is not authorized",
            }
        ).encode()
        self.send_response(400)
        self.send_header("Content-Type", "application/x-amz-json-1.0")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def deny_all() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), DenyAll)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()
    thread.join(timeout=5)


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_access_denied(deny_all, settings, command):
    settings.DYNLOCK = {"default": alias_settings(deny_all, "ttt")}
    error = fails(*command)
    assert error.returncode == 3 and "access denied to table 'ttt'" in str(error)


# -- as a shell sees them -------------------------------------------------------------
def manage(
    endpoint: str, table: str, *args: str, stdin: Any = subprocess.DEVNULL, timeout: float = 60
) -> subprocess.CompletedProcess:
    """``python manage.py COMMAND --settings=tests.settings ARGS`` pointed at a test server."""
    env = server_env({"DYNLOCK_TEST_ENDPOINT_URL": endpoint, "DYNLOCK_TEST_TABLE": table})
    command = [sys.executable, "manage.py", args[0], "--settings=tests.settings", *args[1:]]
    return subprocess.run(command, cwd=REPO_ROOT, env=env, stdin=stdin, capture_output=True, text=True, timeout=timeout)


def manage_all(*calls: tuple[str, ...]) -> list[subprocess.CompletedProcess]:
    """Several independent ``manage(endpoint, table, *args)`` calls at once (mostly Python start-up)."""
    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        return list(pool.map(lambda call: manage(*call), calls))


def no_traceback(result: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in result.stderr, result.stderr


@MOTO
def test_subprocess_createlocktable_and_showlocks(dynlock, other):
    endpoint = dynlock.server.endpoint_url
    table = table_name()
    created = manage(endpoint, table, "createlocktable")
    assert created.returncode == 0 and f"Creating table {table!r}" in created.stdout, created.stderr
    lease = other.acquire("shown", holder={"view": "v"})
    again, listed = manage_all(
        (endpoint, table, "createlocktable"),
        (endpoint, dynlock.options.table_name, "showlocks", "--format", "json"),
    )
    assert again.returncode == 0 and "already exists" in again.stdout
    dummy_client(endpoint).delete_table(TableName=table)
    assert listed.returncode == 0 and [r["key"] for r in json.loads(listed.stdout)] == ["shown"]
    lease.release()


@MOTO
def test_subprocess_breaklock_exit_codes(dynlock, other):
    endpoint, table = dynlock.server.endpoint_url, dynlock.options.table_name
    other.acquire("k")
    asks, broken, missing = manage_all(
        (endpoint, table, "breaklock", "k"),  # stdin is not a terminal: refused before anything is read
        (endpoint, table, "breaklock", "k", "--noinput", "--reason", "test"),
        (endpoint, table, "breaklock", "gone", "--no-input"),
    )
    assert asks.returncode == 2 and "pass --noinput" in asks.stderr
    assert broken.returncode == 0 and "k: broken (token" in broken.stdout
    assert "broke lock 'k'" in broken.stderr  # the audit log line
    assert missing.returncode == 1 and "gone: not broken: not found" in missing.stdout
    assert missing.stderr.strip() == "CommandError: 1 of 1 lock not broken: 'gone'"
    for result in (asks, broken, missing):
        no_traceback(result)


@pytest.mark.skipif(not hasattr(os, "openpty"), reason="needs a pseudo-terminal")
@MOTO
def test_subprocess_breaklock_asks_on_a_terminal(dynlock, other):
    other.acquire("k")
    leader, follower = os.openpty()
    try:
        os.write(leader, b"y\n")  # typed ahead; the terminal buffers it
        result = manage(dynlock.server.endpoint_url, dynlock.options.table_name, "breaklock", "k", stdin=follower)
    finally:
        os.close(follower)
        os.close(leader)
    assert result.returncode == 0, result.stderr
    assert "Break the lease on 'k'? [y/N]" in result.stdout and "k: broken" in result.stdout


@MOTO
def test_subprocess_runlocked_exit_codes(dynlock, other):
    endpoint, table = dynlock.server.endpoint_url, dynlock.options.table_name
    held = other.acquire("busy")
    inner, exits, fails_inner, busy, busy_exit = manage_all(
        (endpoint, table, "runlocked", "a", "--", "showlocks"),
        (endpoint, table, "runlocked", "b", "--", "shell", "-c", "import sys; sys.exit(7)"),
        (endpoint, table, "runlocked", "c", "--", "createlocktable", "--read", "1"),
        (endpoint, table, "runlocked", "busy", "--", "showlocks"),
        (endpoint, table, "runlocked", "busy", "--busy-exit", "75", "--", "showlocks"),
    )
    held.release()
    # The inner command's output goes to the same stdout: here it lists its own lease.
    assert inner.returncode == 0 and "showlocks on" in inner.stdout
    assert exits.returncode == 7
    assert fails_inner.returncode == 2 and "only apply with --billing-mode PROVISIONED" in fails_inner.stderr
    assert busy.returncode == 0 and "Skipped: lock 'busy' is busy" in busy.stdout
    assert busy_exit.returncode == 75 and "Skipped: lock 'busy' is busy" in busy_exit.stderr
    for result in (inner, exits, fails_inner, busy, busy_exit):
        no_traceback(result)
    assert list(dynlock.leases()) == []  # every run released its lease


@MOTO
def test_subprocess_errors(server):
    unreachable, missing, usage, alias = manage_all(
        (UNREACHABLE, "ttt", "showlocks"),
        (server.endpoint_url, table_name(), "runlocked", "k", "--", "check"),
        (server.endpoint_url, "ttt", "showlocks", "--format", "xml"),
        (server.endpoint_url, "ttt", "breaklock", "k", "--alias", "nope", "--noinput"),
    )
    assert unreachable.returncode == 3 and unreachable.stdout == ""
    assert unreachable.stderr.startswith("CommandError: could not connect to DynamoDB at http://127.0.0.1:9")
    assert len(unreachable.stderr.strip().splitlines()) == 1
    assert missing.returncode == 3 and "createlocktable" in missing.stderr
    assert usage.returncode == 2 and "invalid choice: 'xml'" in usage.stderr
    assert alias.returncode == 2 and "unknown alias 'nope'" in alias.stderr
    for result in (unreachable, missing, usage, alias):
        no_traceback(result)


@MOTO
def test_from_a_shell_a_broken_dynlock_setting_exits_2_in_every_command(dynlock):
    # issue 14: Django's system checks fail first and exited 1, which for breaklock means
    # "not every lock was broken"; a setting to fix is exit 2, as documented.
    results = manage_all(
        *[
            (dynlock.server.endpoint_url, "x", *args)
            for args in (
                ("breaklock", "k", "--noinput"),
                ("showlocks",),
                ("runlocked", "k", "--", "check"),
                ("createlocktable",),
            )
        ]
    )
    for result in results:
        assert result.returncode == 2, (result.args, result.stderr)
        assert "dynlock.E008" in result.stderr and "TABLE_NAME" in result.stderr
        no_traceback(result)


# -- what an operator's terminal is shown (issue 14) -----------------------------------------
# ESC [2J clears the screen, ESC ]0;...BEL retitles the window, U+202E shows what follows
# reversed, a newline forges a line of the log.
HOSTILE_KEY = "job:\x1b[2J\x1b[1;1Hall clear\u202e"
HOSTILE_HOLDER = {"path": "/pay/\x1b]0;pwned\x07", "note": "x\ny"}
RAW = ("\x1b", "\x07", "\u202e")


def assert_no_raw_controls(text: str) -> None:
    assert not [c for c in RAW if c in text], repr(text)


@MOTO
def test_showlocks_table_escapes_control_and_bidi_characters(dynlock, other):
    lease = other.acquire(HOSTILE_KEY, holder=HOSTILE_HOLDER)
    out = run("showlocks").out
    assert_no_raw_controls(out)
    assert "job:\\x1b[2J\\x1b[1;1Hall clear\\u202e" in out and "/pay/\\x1b]0;pwned\\x07" in out
    assert "note=x\\ny" in out  # the newline written as \n: one lease, one line
    lease.release()


@MOTO
def test_breaklock_escapes_what_it_shows_before_asking_and_what_it_logs(dynlock, other, monkeypatch, caplog):
    other.acquire(HOSTILE_KEY, holder=HOSTILE_HOLDER)
    shown: list[str] = []
    monkeypatch.setattr(breaklock, "stdin_is_interactive", lambda: True)
    monkeypatch.setattr("builtins.input", lambda prompt: shown.append(prompt) or "y")
    caplog.set_level(logging.WARNING)
    result = run("breaklock", HOSTILE_KEY, "--reason", "stuck\nINFO all is well")
    assert_no_raw_controls(result.out + "".join(shown))
    assert result.out.startswith("job:\\x1b[2J\\x1b[1;1Hall clear\\u202e: token ")
    lines = [r.getMessage() for r in caplog.records if "broke lock" in r.getMessage() or "broken by" in r.getMessage()]
    assert len(lines) == 2  # the command's audit line and the engine's
    for line in lines:
        assert "\n" not in line and "stuck\\nINFO all is well" in line
        assert_no_raw_controls(line)
    other.close()  # its lease was broken under it


@MOTO
def test_runlocked_busy_message_escapes_the_holder(dynlock, other, probe):
    held = other.acquire("k", holder={"command": "dynlock_probe\x1b[2K", **HOSTILE_HOLDER})
    result = run("runlocked", "k", "--", "dynlock_probe")
    assert_no_raw_controls(result.out)
    assert "dynlock_probe\\x1b[2K" in result.out and "\n" not in result.out.rstrip("\n")
    held.release()


def test_a_lost_lease_reports_the_break_reason_escaped(mock_dynlock):
    lease = mock_dynlock.acquire("r")
    assert LockClient(mock_dynlock.options).break_lease("r", reason="ops\n\x1b[31mFAKE")
    with pytest.raises(LockLost) as lost:
        lease.release()
    assert "ops\\n\\x1b[31mFAKE" in str(lost.value) and "\x1b" not in str(lost.value)
    # broken by a client of the holder's own process: told at once, escaped the same way
    lease = mock_dynlock.acquire("r")
    assert mock_dynlock.break_lease("r", reason="ops\x00\x1b[31mFAKE")
    with pytest.raises(LockLost) as lost:
        lease.release()
    assert "ops\\x00\\x1b[31mFAKE" in str(lost.value) and "\x1b" not in str(lost.value)


def test_showlocks_and_breaklock_show_items_the_library_did_not_write(dynlock):
    # issue 14: a foreign item, an expires_at of 1e20, a fractional fence or binary
    # attributes gave showlocks a traceback
    from tests.support.malformed import MALFORMED_ITEMS, put_malformed_items

    keys = put_malformed_items(dummy_client(dynlock.server.endpoint_url), dynlock.options.table_name)
    table = run("showlocks", "--all").out
    for key in keys:
        [line] = [line for line in table.splitlines() if line.startswith(key + " ")]
        assert " malformed " in line, line
    records = json.loads(run("showlocks", "--all", "--format", "json").out)
    assert {r["key"]: r["state"] for r in records} == {key: "malformed" for key in keys}
    assert all(r["problems"] for r in records)
    [fence] = [r for r in records if r["key"] == "bad:fence"]
    assert fence["problems"] == ["fence 1.5 is not a whole number"] and fence["token"] is None
    rows = list(csv.DictReader(io.StringIO(run("showlocks", "--all", "--format", "csv").out)))
    assert len(rows) == len(MALFORMED_ITEMS) and {row["state"] for row in rows} == {"malformed"}
    assert "not a time" in run("showlocks", "--all", "--format", "csv").out
    out = io.StringIO()
    with pytest.raises(CommandError, match="1 of 1 lock not broken"):
        call_command("breaklock", "bad:expires", "--noinput", stdout=out)
    # (servers write the number back differently: DynamoDB Local in full, the others as stored)
    assert re.search(
        r"bad:expires: not broken: a malformed item \(expires_at (1E\+20|1(0){20}) is not a time\)", out.getvalue()
    )
    assert "delete it with the AWS console or CLI if it is not a lock" in out.getvalue()


@MOTO
def test_breaklock_says_a_break_whose_replies_were_lost_may_have_happened(dynlock, settings, caplog):
    # issue 14: it said the lock could not be broken (DynamoDB unreachable), though it was
    from localdynamo.faultproxy import FaultProxy

    other_client(dynlock).acquire("lost-replies")
    with FaultProxy(dynlock.server.endpoint_url, max_seconds=60) as proxy:
        settings.DYNLOCK = {"default": alias_settings(proxy.endpoint_url, dynlock.options.table_name)}
        proxy.lose_a_break(get_lock_client().options.call_attempts)  # breaklock's read before it goes through
        out = io.StringIO()
        with caplog.at_level(logging.WARNING, logger="django_dynlock"):
            with pytest.raises(CommandError, match="1 of 1 lock not broken") as failed:
                call_command("breaklock", "lost-replies", "--noinput", "--reason", "stuck", stdout=out)
    assert failed.value.returncode == 1
    assert "lost-replies: not broken: may have been broken: DynamoDB's replies were lost" in out.getvalue()
    assert "may have broken lock 'lost-replies'" in caplog.text
    assert dynlock.get("lost-replies") is None  # it did land
