"""Fixtures: real DynamoDB-compatible servers and a fresh lock table per test.

- ``dynamodb_local_server`` / ``moto_server`` / ``dynalite_server``: one subprocess each
  per test session, on a free loopback port, always stopped at the end.
- ``server``: parametrised over DynamoDB Local and dynalite, for tests that must hold on either.
- ``dynlock``: a fresh table on ``server`` and ``settings.DYNLOCK`` pointing at it;
  yields the alias' LockClient.
- ``mock_dynlock``: the same on moto's in-process ``mock_aws`` (fast unit tests).
"""

from __future__ import annotations

import inspect
import os
from typing import Any

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
#   built wheel, 100,000 leases listed): one after another on each of two workers, at low
#   priority (BACKGROUND_SUBPROCESSES).
SHARED_SETUP_MODULES = {
    "tests.test_celery",
    "tests.test_postgresql",
    "tests.reliability.test_mixed_faults",
}


# The background tests whose work is in child processes (a build, pip, a pytest run) run on
# a second worker beside the in-process ones (the explorer, the 100,000-lease listings): at
# low priority both wait for whatever CPU the other workers leave, and one queue of all of
# them (about 100 s of CPU and 50 s of waiting for child processes alone, 277 s of wall
# time at load 8) was left to finish alone, on one core, after the other workers were done.
BACKGROUND_SUBPROCESSES = {"tests.test_package", "tests.test_endpoint_mode"}


def xdist_group(item) -> str | None:
    if item.get_closest_marker("background"):
        return "background:subprocesses" if item.module.__name__ in BACKGROUND_SUBPROCESSES else "background"
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
    """Shared-setup groups for xdist; with DYNLOCK_TEST_ENDPOINT, the tests on ``server``
    and nothing that starts a local server; against https (AWS), nothing behind the fault
    proxy, which speaks http only."""
    refuse_marked_helpers({item.module for item in items if getattr(item, "module", None)})
    for item in items:
        group = xdist_group(item)
        if group:
            item.add_marker(pytest.mark.xdist_group(group))
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


def refuse_marked_helpers(modules: set[Any]) -> None:
    """A mark on a module's helper function is silently ignored: a refactor that put a
    helper between ``@pytest.mark.solo`` and its test sent that test into the parallel pass,
    where its latency and thread counts failed CI (stop 41)."""
    misplaced = [
        f"{module.__name__}.{name}"
        for module in modules
        for name, value in vars(module).items()
        if inspect.isfunction(value)
        and value.__module__ == module.__name__
        and not name.startswith("test")
        and getattr(value, "pytestmark", None)
    ]
    if misplaced:
        raise pytest.UsageError(f"marks on functions that are not tests (move them to the test): {misplaced}")


# Seconds the longest tests took (5 s or more; one process, -n 0, at load 3-11 on the
# shared 2-core machine, 2026-11-28), by test function, its slowest parameters: xdist's
# workers take tests in the order collected, so these go first, longest first. A long test
# taken late runs on while the other workers have run out of tests (the 60 s wait did, for
# 44 s; test_waiting.py, collected last, has two of 12 s). The background and shared-setup
# groups are not listed: each runs as one unit. Other slow-marked tests count as
# SLOW_UNLISTED seconds, the rest as none.
LONGEST_TESTS = {
    "tests/test_partition_priority.py::test_a_live_holder_keeps_its_lease_while_its_waiters_drain_the_partition": 48,
    "tests/test_election.py::test_never_two_leaders_through_faults_and_a_cut_link_to_the_leader": 46,
    "tests/test_waiting.py::test_a_waiter_waits_60_s_for_a_key_another_process_holds_40_s": 46,
    "tests/test_election.py::test_never_two_leaders_among_five_processes_resigning_or_killed": 44,
    "tests/test_takeover.py::test_a_live_holder_is_never_taken_over_whatever_the_clocks": 40,
    "tests/test_election.py::test_standby_cost_and_failover_times": 34,
    # The semaphores', the observability's and django-celery-beat's, as their authors measured
    # them on a loaded machine (to be measured again in one process).
    "tests/test_semaphore_processes.py::test_never_more_than_the_larger_limit_through_faults_and_a_change_of_the_limit": 29,
    "tests/test_semaphore_processes.py::test_never_more_than_n_with_holders_killed_and_their_slots_taken_over": 25,
    "tests/test_semaphore_processes.py::test_4n_contenders_on_n_slots_share_them_fairly": 20,
    "tests/test_semaphore_processes.py::test_tenants_keep_their_own_limits_at_the_same_time": 17,
    "tests/test_celery_beat.py::test_beat_over_a_failover_with_django_celery_beats_database_scheduler": 20,
    "tests/test_observability.py::test_one_scrape_sums_three_gunicorn_workers": 8,
    "tests/test_observability.py::test_a_scripted_scenario_gives_exact_counts": 7,
    "tests/reliability/test_holders.py::test_a_throttling_storm_costs_no_lease_and_breaks_nothing": 20,
    "tests/test_celery_beat.py::test_beat_over_a_failover_sends_each_entry_once_and_misses_at_most_the_lease_and_3s": 20,
    "tests/test_demo.py::test_ctrl_c_stops_the_demo_and_exits_0": 17,
    "tests/reliability/test_holders.py::test_an_outage_during_leases_ends_them_before_they_run_out_and_hands_out_none": 17,
    "tests/test_admin_browser.py::test_a_demo_run_shows_its_lock_on_the_page_and_in_the_refreshing_admin_list": 16,
    "tests/commands/test_from_a_shell.py::test_subprocess_runlocked_exit_codes": 16,
    "tests/commands/test_from_a_shell.py::test_subprocess_errors": 16,
    "tests/test_admin_browser.py::test_auto_refresh_keeps_the_operators_selection_and_can_be_turned_off": 15,
    "tests/commands/test_from_a_shell.py::test_from_a_shell_a_broken_dynlock_setting_exits_2_in_every_command": 15,
    "tests/test_exclusion.py::test_processes_never_overlap_and_lose_no_update": 15,
    "tests/commands/test_from_a_shell.py::test_subprocess_createlocktable_and_showlocks": 14,
    "tests/commands/test_standby.py::test_the_childs_exit_code_passes_through_and_the_term_is_resigned": 14,
    "tests/test_admin_browser.py::test_break_a_lease_held_by_another_process": 13,
    "tests/test_forgotten_watches.py::test_a_client_trying_more_keys_than_it_remembers_takes_over_every_dead_holder": 13,
    "tests/test_gunicorn.py::test_a_killed_workers_key_is_free_for_the_next_request_within_lease_plus_3s": 13,
    "tests/test_takeover.py::test_a_process_retrying_every_200ms_takes_over_a_killed_holder": 12,
    "tests/test_waiting.py::test_throttled_waiters_back_off": 12,
    "tests/test_fencing.py::test_decorated_code_never_runs_concurrently_across_processes": 12,
    "tests/test_waiting.py::test_one_wait_past_1100_polls_acquires": 12,
    "tests/commands/test_standby.py::test_a_leader_cut_off_stops_its_child_before_the_next_leaders_child_starts": 12,
    "tests/test_engine_logging.py::test_the_takeover_of_a_killed_holder_is_one_info_line": 11,
    "tests/test_missing_date.py::test_a_dateless_holder_with_a_slow_wall_clock_is_taken_over_only_once_dead": 11,
    "tests/commands/test_runlocked.py::test_runlocked_at_least_keeps_the_lock": 11,
    "tests/commands/test_standby.py::test_the_limit_a_paused_runlocked_cannot_stop_its_child_until_it_wakes": 11,
    "tests/test_exclusion.py::test_paused_holder_knows_it_lost_before_it_could_write": 9,
    "tests/test_takeover.py::test_fresh_one_shot_processes_take_over_a_killed_holder": 9,
    "tests/test_celery_beat.py::test_a_term_that_times_out_never_ends_beat_and_it_leads_again_after": 9,
    "tests/test_fitted_options.py::test_a_9_s_lease_whose_renewals_hang_is_at_risk_before_it_is_lost": 9,
    "tests/test_admin_browser.py::test_an_elections_badge_keeps_the_list_within_the_window": 9,
    "tests/commands/test_from_a_shell.py::test_subprocess_breaklock_exit_codes": 8,
    "tests/test_admin_browser.py::test_the_lease_pages_are_laid_out_like_djangos_own": 8,
    "tests/test_clock_outliers.py::test_a_holder_that_saw_one_backward_dated_reply_and_lost_its_link": 8,
    "tests/commands/test_standby.py::test_sigterm_stops_the_child_and_resigns_and_the_standby_takes_over": 8,
    "tests/reliability/test_holders.py::test_a_killed_holder_is_taken_over_within_a_lease_and_nothing_overlaps": 8,
    "tests/commands/test_standby.py::test_bad_combinations_exit_2_from_a_shell": 8,
    "tests/reliability/test_restart.py::test_after_a_restart_the_holder_loses_its_lease_before_anyone_else_can_hold_it": 8,
    "tests/reliability/test_restart.py::test_a_table_recreated_while_the_holder_trusts_its_lease_lets_a_second_holder_in_but_fencing_still_holds": 8,
    "tests/test_engine.py::test_heartbeats_keep_a_lease_past_its_duration": 8,
    "tests/commands/test_standby.py::test_sigkill_after_grace_for_a_child_that_ignores_sigterm": 7,
    "tests/test_fence_base.py::test_a_slow_fresh_process_continues_the_tokens_after_the_item_was_deleted": 7,
    "tests/test_handover.py::test_a_handed_over_lease_is_continued_by_its_adopter": 7,
    "tests/test_uvicorn.py::test_dynamodb_in_trouble_makes_an_async_view_answer_503_with_retry_after": 7,
    "tests/reliability/test_holders.py::test_a_stopped_holder_resumes_knowing_it_lost_and_does_not_write": 7,
    "tests/test_adopt_clock.py::test_a_fresh_process_adopts_by_dynamodbs_clock": 6,
    "tests/test_clock_outliers.py::test_a_taker_that_saw_one_forward_dated_reply_while_the_holder_was_cut_off": 6,
    "tests/test_election.py::test_campaign_wait_zero_keeps_the_standby_cadence": 6,
    "tests/commands/test_from_a_shell.py::test_subprocess_breaklock_asks_on_a_terminal": 6,
    "tests/commands/test_showlocks.py::test_showlocks_tells_a_lease_kept_by_at_least_from_a_crashed_holders": 5,
    "tests/commands/test_standby.py::test_kill_9_of_runlocked_takes_its_child": 5,
}
SLOW_UNLISTED = 5.0


def expected_seconds(item) -> float:
    known = LONGEST_TESTS.get(item.nodeid.split("[", 1)[0])
    if known is not None:
        return known
    return SLOW_UNLISTED if item.get_closest_marker("slow") else 0.0


class LongestFirst:
    """On an xdist worker, the collection sorted by expected_seconds, longest first; a stable
    sort keeps the rest as collected, the same on every worker, as xdist requires. A plugin
    of its own, to run after pytest-django's sort (database tests first, as Django orders
    them), which undid the slow-first sort this conftest's hook made before it: 140 tests of
    the database and the admin came before the first slow test."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items):
        if os.environ.get("PYTEST_XDIST_WORKER"):
            items.sort(key=expected_seconds, reverse=True)


def pytest_configure(config):
    config.pluginmanager.register(LongestFirst(), "dynlock-longest-first")


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
