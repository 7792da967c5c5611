"""Fixtures: real DynamoDB-compatible servers and a fresh lock table per test.

- ``dynamodb_local_server`` / ``moto_server`` / ``dynalite_server``: one subprocess each
  per test session, on a free loopback port, always stopped at the end.
- ``server``: parametrised over DynamoDB Local and dynalite, for tests that must hold on either.
- ``dynlock``: a fresh table on ``server`` and ``settings.DYNLOCK`` pointing at it;
  yields the alias' LockClient.
- ``mock_dynlock``: the same on moto's in-process ``mock_aws`` (fast unit tests).
"""

from __future__ import annotations

import os

import pytest

from localdynamo.servers import DUMMY_CREDENTIALS, DUMMY_REGION

DUMMY_KEYS = {
    "AWS_ACCESS_KEY_ID": DUMMY_CREDENTIALS["aws_access_key_id"],
    "AWS_SECRET_ACCESS_KEY": DUMMY_CREDENTIALS["aws_secret_access_key"],
}
if os.environ.get("DYNLOCK_TEST_ENDPOINT"):
    # `make test-endpoint`: the environment's credentials and region are the point (a
    # DynamoDB Local run by hand accepts any: dummy ones unless some are set).
    if not (os.environ.get("AWS_ACCESS_KEY_ID") or os.environ.get("AWS_PROFILE")):
        os.environ.update(DUMMY_KEYS)
    os.environ.setdefault("AWS_DEFAULT_REGION", DUMMY_REGION)
else:
    # Never read the developer's own AWS configuration or credentials.
    for _name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_ROLE_ARN"):
        os.environ.pop(_name, None)
    os.environ.update(
        AWS_CONFIG_FILE=os.devnull,
        AWS_SHARED_CREDENTIALS_FILE=os.devnull,
        **DUMMY_KEYS,
        AWS_DEFAULT_REGION=DUMMY_REGION,
        AWS_EC2_METADATA_DISABLED="true",
    )

from localdynamo.servers import (  # noqa: E402
    QUICK_START_JAVA,
    TEST_ENDPOINT,
    LocalServer,
    start_dynalite,
    start_dynamodb_local,
    start_moto_server,
)
from tests.support.endpoint import Endpoint, delete_tables_of_this_run  # noqa: E402
from tests.support.tools import need_dynalite, need_dynamodb_local  # noqa: E402


@pytest.fixture(scope="session")
def dynamodb_local_server():
    need_dynamodb_local()
    server = start_dynamodb_local(java_options=QUICK_START_JAVA)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def moto_server():
    server = start_moto_server()
    yield server
    server.stop()


# dynalite keeps a new table CREATING for 500 ms by default, and every test makes a fresh
# table: the suite's dynalite makes them ACTIVE at once (the createlocktable tests about
# CREATING start a dynalite of their own that keeps them CREATING).
INSTANT_TABLES = ["--createTableMs", "0", "--deleteTableMs", "0", "--updateTableMs", "0"]


@pytest.fixture(scope="session")
def dynalite_server():
    need_dynalite()
    server = start_dynalite(extra_args=INSTANT_TABLES)
    yield server
    server.stop()


# The matrix every server-facing test runs on: AWS's own DynamoDB Local (the reference)
# and dynalite (validates like DynamoDB, lacks TTL, transactions and the item on a failed
# condition). moto server keeps the tests that name it (the fault proxy's, late requests,
# bad input, heartbeat load, command subprocesses, restarts) and moto's mock_aws the unit
# tests and the explorer.
# With DYNLOCK_TEST_ENDPOINT, only the endpoint, and only the tests that run on ``server``.
# DYNLOCK_TEST_SERVERS narrows the matrix: the Django 4.2 pass checks the Django layer on
# the reference server alone (what differs between servers is the main pass's concern).
SERVER_MATRIX = ["dynamodb-local", "dynalite"]


def server_params() -> list[str]:
    if TEST_ENDPOINT:
        return ["endpoint"]
    chosen = [name.strip() for name in os.environ.get("DYNLOCK_TEST_SERVERS", "").split(",") if name.strip()]
    unknown = set(chosen) - set(SERVER_MATRIX)
    if unknown:
        raise pytest.UsageError(
            f"DYNLOCK_TEST_SERVERS: unknown {sorted(unknown)}; choose from {', '.join(SERVER_MATRIX)}"
        )
    return chosen or SERVER_MATRIX


@pytest.fixture(params=server_params())
def server(request) -> LocalServer | Endpoint:
    if request.param == "endpoint":
        return Endpoint(TEST_ENDPOINT)
    return request.getfixturevalue(f"{request.param.replace('-', '_')}_server")


LOCAL_SERVER_FIXTURES = {"dynamodb_local_server", "moto_server", "dynalite_server"}

# `make test` runs the suite on several pytest-xdist workers (--dist loadgroup), each with
# servers of its own (the session fixtures above). Tests spread one at a time, except:
# - those that share a costly module fixture (a module's Celery worker, its PostgreSQL
#   server, the mixed-fault run of one server): each such set goes to one worker, so the
#   fixture is set up once, as in a run without workers;
# - the background tests (CPU-bound, in virtual time or without timing: the explorer, the
#   built wheel, 100,000 leases listed): one after another on one worker, at low priority.
SHARED_SETUP_MODULES = {
    "tests.test_celery",
    "tests.test_postgresql",
    "tests.reliability.test_mixed_faults",
}


def xdist_group(item) -> str | None:
    if item.get_closest_marker("background"):
        return "background"
    module = item.module.__name__
    if module not in SHARED_SETUP_MODULES:
        return None
    # The mixed-fault runs are one module fixture per server: a group per server. (No
    # brackets in a group name: xdist reads a name that ends in "]" as no group.)
    server = getattr(item, "callspec", None) and next(
        (value for value in item.callspec.params.values() if value in SERVER_MATRIX), None
    )
    return f"{module}:{server}" if server else module


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    """A background test's body runs at nice 10 on an xdist worker, so it takes only the CPU
    the timing-sensitive tests on the other workers leave; its child processes inherit that.
    Only as root (CI), which can restore the worker's priority after it."""
    lower = item.get_closest_marker("background") and os.environ.get("PYTEST_XDIST_WORKER") and os.geteuid() == 0
    if not lower:
        yield
        return
    before = os.getpriority(os.PRIO_PROCESS, 0)
    os.setpriority(os.PRIO_PROCESS, 0, before + 10)
    try:
        yield
    finally:
        os.setpriority(os.PRIO_PROCESS, 0, before)


@pytest.hookimpl(tryfirst=True)  # before xdist reads the marks
def pytest_collection_modifyitems(config, items):
    """Shared-setup groups for xdist, and the slow tests first; with DYNLOCK_TEST_ENDPOINT,
    the tests on ``server`` and nothing that starts a local server; against https (AWS),
    nothing behind the fault proxy, which speaks http only."""
    for item in items:
        group = xdist_group(item)
        if group:
            item.add_marker(pytest.mark.xdist_group(group))
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # Workers take tests in this order: a long test taken last (the 60 s wait was) runs
        # alone at the end while the other workers idle. A stable sort keeps the rest as
        # collected, the same on every worker, as xdist requires.
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)
    if not TEST_ENDPOINT:
        return
    keep, drop = [], []
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        proxied = TEST_ENDPOINT.startswith("https:") and (
            "FaultProxy" in vars(item.module) or item.module.__name__.startswith("tests.reliability.")
        )
        (keep if "server" in names and not names & LOCAL_SERVER_FIXTURES and not proxied else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_runtest_setup(item):
    """On an xdist worker with --dist loadgroup, a grouped test's node id ends in its group
    ("@background"): that is how xdist tells the controller. pytest 9.2 stopped reading the
    id xdist 3.8 rewrites (pytest-xdist issue 1386), so every group was silently ignored:
    module fixtures set up on several workers, the background tests side by side. Each
    grouped test fails instead."""
    if (
        getattr(item.config.option, "loadgroup", False)
        and item.get_closest_marker("xdist_group")
        and "@" not in item.nodeid.rsplit("]", 1)[-1]
    ):
        pytest.fail(
            "--dist loadgroup lost this test's xdist_group: this pytest does not read the node ids "
            "pytest-xdist rewrites; use the versions setup.cfg's dev extra allows",
            pytrace=False,
        )


def pytest_sessionfinish(session, exitstatus):
    """With DYNLOCK_TEST_ENDPOINT: every table of this run deleted at the end, after failures
    too, and the run failed if any is left. Only tables named with this run's prefix are
    touched. With xdist workers, by the controller once they all have finished (a worker
    that finished early would delete tables another is still using)."""
    if not TEST_ENDPOINT or hasattr(session.config, "workerinput"):
        return
    left = delete_tables_of_this_run(TEST_ENDPOINT)
    if left:
        session.config.get_terminal_writer().line(f"tables of this run still there after cleanup: {left}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(autouse=True)
def _fresh_answer_counts():
    """The decorator logs a view's busy and failed answers once an interval (docs/logging.md):
    each test starts with none counted, as a fresh process does."""
    from django_dynlock.decorators import answers

    answers.clear()


@pytest.fixture
def dynlock(server, settings):
    """A fresh lock table on a real server; yields the default alias' LockClient."""
    from tests.support.tables import fresh_table

    with fresh_table(settings, server.endpoint_url) as client:
        client.server = server  # for tests that need to know where they are
        yield client


@pytest.fixture
def mock_dynlock(settings):
    """A lock table on moto's in-process mock (no HTTP): for fast unit tests."""
    from tests.support.tables import fresh_table

    with fresh_table(settings, None) as client:
        yield client
