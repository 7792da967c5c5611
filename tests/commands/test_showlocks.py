"""showlocks: listing the leases as a table, JSON or CSV, streamed, and --watch."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import os
import re
import time
import tracemalloc
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import call_command

from django_dynlock import LockLost, get_lock_client
from django_dynlock.engine.items import LeaseInfo
from django_dynlock.management.commands import showlocks
from localdynamo.servers import suite_region
from tests.support.aliases import alias_settings
from tests.support.calls import count_calls
from tests.support.commands import MOTO, UNREACHABLE, fails, run


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


def test_showlocks_tells_a_lease_kept_by_at_least_from_a_crashed_holders(dynlock, other):
    # issue 35: a lease kept with runlocked --at-least, once expired, was hidden because
    # "the holder stopped renewing": its run had ended and kept it on purpose.
    run("runlocked", "kept", "--at-least", "0.5", "--", "check")
    other.acquire("crashed").keep_for(0.2)  # a holder that stopped renewing
    assert dynlock.get("kept").holder == {"command": "check", "at_least": "0.5"}
    time.sleep(0.55 + other.clock.uncertainty() + dynlock.clock.uncertainty())

    lines = run("showlocks").out.splitlines()
    assert (
        lines[-2]
        == "(1 expired lease not shown: the holder stopped renewing. The next acquire takes it over; --all shows them.)"
    )
    assert lines[-1] == (
        "(1 expired lease not shown: runlocked --at-least kept it after its run, as asked. The next acquire "
        "takes it over; --all shows them.)"
    )
    everything = run("showlocks", "--all").out
    assert re.search(
        r"^kept +expired +\d+ +check on .* expired [0-9.]+s ago +at_least=0\.5$", everything, re.MULTILINE
    ), everything


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
    assert states == {"released": "released", "broken": "broken:", "expired": "expired", "held": "held"}
    # issue 31: a broken lease says why, and by whom
    (broken_row,) = [line for line in rows if line.startswith("broken ")]
    assert "broken: stuck, by operator " in broken_row
    assert re.search(r"  expired [0-9.]+s ago$", everything, re.MULTILINE)  # the EXPIRES column

    records = {r["key"]: r for r in json.loads(run("showlocks", "--all", "--format", "json").out)}
    assert records["broken"]["break_reason"] == "stuck" and records["broken"]["released_by"].startswith("break:")
    assert records["released"]["expires_in"] is None and records["released"]["released_at"]
    held.release()


@MOTO
def test_showlocks_shows_elections_and_each_terms_age(dynlock, other):
    """issue 37: a term of client.election(name) is shown as that election, with its age
    (time since it was elected) while it is held; a plain lease whose holder merely says
    ``election`` (not on the key ``election:<name>``) is not."""
    term = other.election("beat", lease=8.0, holder={"command": "celery beat", "scheduler": "S"}).campaign(wait=5)
    plain = other.acquire("job:1", holder={"function": "jobs.run", "election": "beat"})
    time.sleep(1.2)  # a term age of a second at least
    rows = {line.split()[0]: line for line in run("showlocks").out.splitlines()[1:-1]}
    assert re.search(r"  election beat, term age [12]s; scheduler=S$", rows["election:beat"]), rows
    assert f"celery beat on {os.uname().nodename}:{os.getpid()}" in rows["election:beat"]
    assert rows["job:1"].endswith("election=beat")

    records = {r["key"]: r for r in json.loads(run("showlocks", "--format", "json").out)}
    assert records["election:beat"]["election"] == "beat"
    assert 1.0 <= records["election:beat"]["term_age"] < 8.0
    assert records["election:beat"]["holder"] == {"command": "celery beat", "scheduler": "S", "election": "beat"}
    assert records["job:1"]["election"] is None and records["job:1"]["term_age"] is None
    cells = {r["key"]: r for r in csv.DictReader(io.StringIO(run("showlocks", "--format", "csv").out))}
    assert cells["election:beat"]["election"] == "beat" and 1.0 <= float(cells["election:beat"]["term_age"]) < 8.0
    assert cells["job:1"]["election"] == "" and cells["job:1"]["term_age"] == ""

    term.release()  # resigned: still an election's (--all), with no term age
    plain.release()
    rows = {line.split()[0]: line for line in run("showlocks", "--all").out.splitlines()[1:-1]}
    assert re.search(r"  election beat; scheduler=S$", rows["election:beat"]), rows
    [record] = [r for r in json.loads(run("showlocks", "--all", "--format", "json").out) if r["key"] == "election:beat"]
    assert record["state"] == "released" and record["election"] == "beat" and record["term_age"] is None


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
        # and showlocks' read of one key to learn the key schema (tests/test_checks_table.py)
        monkeypatch.setattr(client, "get", lambda *args, **kwargs: None)

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
@pytest.mark.background
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
