"""Celery beat that sends only while leading (issue 37): ``LeaderScheduler``.

The failover test runs two real ``celery beat`` processes (tests/support/beat_app.py) on
kombu's filesystem transport, against DynamoDB Local, and reads what each sent from the
broker's folder. The fast tests drive a scheduler in this process, on an in-memory broker,
against DynamoDB Local (and, for the errors, a missing table and a closed port).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

pytest.importorskip("celery")

from celery import Celery, signals  # noqa: E402
from celery.beat import PersistentScheduler, Scheduler  # noqa: E402
from django.core import checks  # noqa: E402

from django_dynlock import InvalidArgument  # noqa: E402
from django_dynlock.celery import LeaderScheduler  # noqa: E402
from localdynamo.faultproxy import FaultProxy  # noqa: E402
from localdynamo.servers import REPO_ROOT, table_name  # noqa: E402
from tests.support import beat_app  # noqa: E402
from tests.support import celery_app as tasks  # noqa: E402
from tests.support.clients import client_for  # noqa: E402
from tests.support.polling import wait_for  # noqa: E402
from tests.support.tables import delete_table, fresh_table  # noqa: E402

# -- beat over a failover: two celery beat processes ------------------------------------


def beat_env(folder: Path, endpoint: str, table: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env.update(
        DYNLOCK_CELERY_DIR=str(folder),
        DYNLOCK_TEST_ENDPOINT_URL=endpoint,
        DYNLOCK_TEST_TABLE=table,
        PYTHONPATH=str(REPO_ROOT),
        **extra,
    )
    return env


def start_beat(
    name: str, folder: Path, endpoint: str, table: str, app: str = "tests.support.beat_app", **extra: str
) -> tuple[subprocess.Popen, Path]:
    env = beat_env(folder, endpoint, table, **extra)
    log = folder / f"beat-{name}.log"
    with open(log, "w") as out:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                app,
                "beat",
                "-S",
                "django_dynlock.celery.LeaderScheduler",
                "-s",
                str(folder / f"schedule-{name}"),
                "--pidfile",
                str(folder / f"beat-{name}.pid"),
                "--loglevel=INFO",
            ],
            cwd=REPO_ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return process, log


def sends(folder: Path, task: str = "tests.support.beat_app.beat_tick") -> list[tuple[float, int]]:
    """(monotonic seconds, sender pid) of each message in the broker's queue folder, in order.

    The transport names each message file after ``time.monotonic()`` in ms when it was
    written (one clock for all processes on Linux); the sender is Celery's ``origin``
    header, ``gen<pid>@<host>``."""
    found = []
    for path in Path(folder, "queue").glob("*.msg"):
        payload = json.loads(path.read_text())
        origin = payload["headers"]["origin"]
        assert payload["headers"]["task"] == task
        found.append((int(path.name.split("_", 1)[0]) / 1000, int(origin.split("@", 1)[0].removeprefix("gen"))))
    return sorted(found)


def stop(process: subprocess.Popen, sig: int = signal.SIGTERM) -> None:
    if process.poll() is None:
        os.killpg(process.pid, sig)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


@pytest.mark.slow
def test_beat_over_a_failover_sends_each_entry_once_and_misses_at_most_the_lease_and_3s(
    dynamodb_local_server, tmp_path
):
    """Beat A leads, beat B stands by; A is SIGKILLed; B takes over. Every send is one
    message in the broker's folder. Checked: only the leader sends (A's sends all come
    before B's first); no two sends of the 1 s entry closer than 0.8 s (an entry sent
    twice in one interval would be two beats' sends, at any phase; 0.2 s is for a send
    written late after its reservation on a loaded machine); the hole at the failover,
    less the interval, is at most the lease + 3 s; B, stopped with SIGTERM, resigns.
    About 30 s."""
    endpoint = dynamodb_local_server.endpoint_url
    table = table_name()
    client = client_for(endpoint, table)  # the suite's options; it reads the leader below
    client.create_table(wait=True)
    folder = tmp_path / "broker"
    folder.mkdir()
    beats: list[subprocess.Popen] = []
    try:
        a, log_a = start_beat("a", folder, endpoint, table)
        beats.append(a)
        wait_for(lambda: a.poll() is not None or "elected leader" in log_a.read_text(), 60, "beat A elected")
        assert a.poll() is None, log_a.read_text()
        b, log_b = start_beat("b", folder, endpoint, table)
        beats.append(b)
        wait_for(lambda: b.poll() is not None or "standing by" in log_b.read_text(), 60, "beat B standing by")
        assert b.poll() is None, log_b.read_text()
        time.sleep(4.0)  # A sends, B stands by
        leader = client.get("election:beat-test")
        assert leader is not None and leader.pid == a.pid
        os.killpg(a.pid, signal.SIGKILL)
        killed = time.monotonic()
        a.wait(timeout=10)
        wait_for(
            lambda: b.poll() is not None or "elected leader" in log_b.read_text(),
            tasks.LEASE + 3.0 + 5.0,
            "beat B elected",
        )
        assert b.poll() is None, log_b.read_text()
        elected = time.monotonic()
        time.sleep(4.0)  # B sends
        stop(b)
        assert b.returncode == 0, log_b.read_text()
        assert client.get("election:beat-test") is None, "beat B did not resign on SIGTERM"
        sent = sends(folder)
        by_a = [t for t, pid in sent if pid == a.pid]
        by_b = [t for t, pid in sent if pid == b.pid]
        assert len(by_a) + len(by_b) == len(sent), sent
        assert len(by_a) >= 4 and len(by_b) >= 3, (by_a, by_b, log_b.read_text())
        assert max(by_a) < killed and min(by_b) > max(by_a), (by_a, by_b)
        gaps = [later - earlier for (earlier, _), (later, _) in zip(sent, sent[1:])]
        assert min(gaps) >= 0.8 * beat_app.INTERVAL, gaps
        hole = min(by_b) - max(by_a)
        missed = hole - beat_app.INTERVAL
        assert missed <= tasks.LEASE + 3.0, (hole, gaps)
        print(
            f"\nsends: A {len(by_a)}, B {len(by_b)}; shortest gap {min(gaps):.3f}s; "
            f"hole {hole:.2f}s (missed {missed:.2f}s of entries); B elected {elected - killed:.2f}s after the kill"
        )
    finally:
        for process in beats:
            stop(process, signal.SIGKILL)
        client.close()
        delete_table(endpoint, table)


def django_celery_beat_skip() -> str | None:
    """Why the django-celery-beat test cannot run here, or None."""
    from importlib import metadata

    import django

    try:
        version = metadata.version("django-celery-beat")
    except metadata.PackageNotFoundError:
        return "django-celery-beat is not installed (pip install -e '.[dev]')"
    if django.VERSION[:2] >= (6, 1):
        # Its newest, 2.9, requires Django<6.1; on 6.1 the resolver can only pick 2.1 (2020).
        return f"django-celery-beat supports Django up to 6.0 (2.9: Django<6.1); here Django {django.get_version()}, django-celery-beat {version}"
    return None


@pytest.mark.slow
def test_beat_over_a_failover_with_django_celery_beats_database_scheduler(dynamodb_local_server, tmp_path):
    """As the failover test above, with the periodic task a row of django-celery-beat's
    tables (a SQLite file both beats share) and its DatabaseScheduler named by
    ``beat_scheduler``, as a project's ``CELERY_BEAT_SCHEDULER`` names it, while beat is
    started with ``-S django_dynlock.celery.LeaderScheduler``: that wraps it (it wrapped
    beat's PersistentScheduler, which has no such task, and nothing was ever sent). Only
    the leader sends; no two sends closer than 0.8 s; the standby leads within the lease
    + 3 s of the leader's SIGKILL; B, stopped with SIGTERM, saves the schedule to the
    database as leader (its last send's time) and resigns. About 25 s."""
    reason = django_celery_beat_skip()
    if reason:
        pytest.skip(reason)
    from tests.support import beat_db_app

    endpoint = dynamodb_local_server.endpoint_url
    table = table_name()
    client = client_for(endpoint, table)
    client.create_table(wait=True)
    folder = tmp_path / "broker"
    folder.mkdir()
    database = str(tmp_path / "beat.sqlite3")
    setup = subprocess.run(
        [sys.executable, "-m", "tests.support.beat_db_app"],
        cwd=REPO_ROOT,
        env=beat_env(folder, endpoint, table, DYNLOCK_BEAT_DATABASE=database),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert setup.returncode == 0, setup.stdout + setup.stderr
    key = f"election:{beat_db_app.ELECTION}"
    beats: list[subprocess.Popen] = []
    try:
        a, log_a = start_beat("a", folder, endpoint, table, "tests.support.beat_db_app", DYNLOCK_BEAT_DATABASE=database)
        beats.append(a)
        wait_for(lambda: a.poll() is not None or "elected leader" in log_a.read_text(), 60, "beat A elected")
        assert a.poll() is None, log_a.read_text()
        assert "wraps -> django_celery_beat.schedulers:DatabaseScheduler" in log_a.read_text(), log_a.read_text()
        b, log_b = start_beat("b", folder, endpoint, table, "tests.support.beat_db_app", DYNLOCK_BEAT_DATABASE=database)
        beats.append(b)
        wait_for(lambda: b.poll() is not None or "standing by" in log_b.read_text(), 60, "beat B standing by")
        assert b.poll() is None, log_b.read_text()
        time.sleep(4.0)  # A sends, B stands by
        leader = client.get(key)
        assert leader is not None and leader.pid == a.pid
        os.killpg(a.pid, signal.SIGKILL)
        killed = time.monotonic()
        a.wait(timeout=10)
        wait_for(
            lambda: b.poll() is not None or "elected leader" in log_b.read_text(),
            tasks.LEASE + 3.0 + 5.0,
            "beat B elected",
        )
        assert b.poll() is None, log_b.read_text()
        elected = time.monotonic()
        time.sleep(4.0)  # B sends
        stop(b)
        assert b.returncode == 0, log_b.read_text()
        assert client.get(key) is None, "beat B did not resign on SIGTERM"
        sent = sends(folder, beat_db_app.TASK)
        by_a = [t for t, pid in sent if pid == a.pid]
        by_b = [t for t, pid in sent if pid == b.pid]
        assert len(by_a) + len(by_b) == len(sent), sent
        assert len(by_a) >= 4 and len(by_b) >= 3, (by_a, by_b, log_a.read_text(), log_b.read_text())
        assert max(by_a) < killed and min(by_b) > max(by_a), (by_a, by_b)
        gaps = [later - earlier for (earlier, _), (later, _) in zip(sent, sent[1:])]
        assert min(gaps) >= 0.8 * beat_db_app.INTERVAL, gaps
        hole = min(by_b) - max(by_a)
        assert elected - killed <= tasks.LEASE + 3.0, (elected - killed, log_b.read_text())
        assert hole - beat_db_app.INTERVAL <= tasks.LEASE + 3.0, (hole, gaps)
        print(
            f"\nsends: A {len(by_a)}, B {len(by_b)}; shortest gap {min(gaps):.3f}s; "
            f"hole {hole:.2f}s; B elected {elected - killed:.2f}s after the kill"
        )
    finally:
        for process in beats:
            stop(process, signal.SIGKILL)
        client.close()
        delete_table(endpoint, table)


# -- one scheduler in this process ------------------------------------------------------


@pytest.fixture
def local(dynamodb_local_server, settings):
    """A fresh table on DynamoDB Local, the default alias on it with a 2 s lease."""
    with fresh_table(settings, dynamodb_local_server.endpoint_url, LEASE_DURATION=2.0, HEARTBEAT_PERIOD=0.5) as client:
        yield client


@pytest.fixture
def published():
    """(monotonic time, task name) of each task message this process publishes."""
    sent: list[tuple[float, str]] = []

    def on_publish(sender=None, **_):
        sent.append((time.monotonic(), sender))

    signals.before_task_publish.connect(on_publish, weak=False)
    yield sent
    signals.before_task_publish.disconnect(on_publish)


def beat_app_for(election: str, every: float = 0.2, **conf) -> Celery:
    """An app on kombu's in-memory broker with one entry due every ``every`` seconds."""
    app = Celery(f"fast-{uuid.uuid4().hex[:6]}", set_as_current=False)
    app.conf.update(
        broker_url="memory://",
        beat_schedule={"often": {"task": "fast.noop", "schedule": every}},
        beat_max_loop_interval=0.5,
        dynlock_beat_election=election,
        **conf,
    )
    app.task(name="fast.noop")(lambda: None)
    return app


def scheduler_for(app: Celery, tmp_path: Path, lazy: bool = False) -> LeaderScheduler:
    return LeaderScheduler(app=app, schedule_filename=str(tmp_path / uuid.uuid4().hex), lazy=lazy)


def tick_for(scheduler: LeaderScheduler, seconds: float) -> list[float]:
    """Tick as beat does (sleeping what tick returns, at most 0.1 s here) for ``seconds``."""
    intervals = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        intervals.append(scheduler.tick())
        time.sleep(max(0.0, min(intervals[-1], 0.1)))  # beat sleeps only for a positive interval
    return intervals


def peer(client):
    return client_for(client.options.endpoint_url, client.options.table_name)


def test_a_standby_sends_nothing_and_leads_after_the_leader_resigns(local, published, tmp_path):
    name = f"standby-{uuid.uuid4().hex[:6]}"
    rival = peer(local)
    beat = scheduler_for(beat_app_for(name), tmp_path)
    try:
        term = rival.election(name, lease=2.0).campaign(wait=5)
        intervals = tick_for(beat, 2.5)  # the entry is due 12 times or so
        assert published == []
        assert not beat.may_send() and beat.term is None
        assert max(intervals) <= beat.election.poll
        term.release()  # resign: the standby's next look (2.1 s at most) takes over
        resigned = time.monotonic()
        wait_for(lambda: tick_for(beat, 0.05) and published, 5, "a send after the resignation")
        assert published[0][0] - resigned < 2.5 + 0.5
        assert beat.term is not None and beat.term.is_held and beat.term.token > term.token
        # The standby moved its entry on as if it had sent it: one send on taking over, not a backlog.
        assert len(published) == 1
    finally:
        beat.close()
        rival.close(release=True)
    assert local.get(f"election:{name}") is None, "close() resigns"


def test_a_lost_term_stops_the_sends_at_once(local, published, tmp_path, caplog):
    name = f"lost-{uuid.uuid4().hex[:6]}"
    rival = peer(local)
    beat = scheduler_for(beat_app_for(name), tmp_path)
    try:
        wait_for(lambda: tick_for(beat, 0.05) and published, 5, "the first send")
        lost = beat.term
        assert lost is not None and lost.is_held
        # An operator breaks the term and another contender is elected at once; the
        # heartbeat's next renewal (0.5 s) finds it taken.
        assert local.break_lease(f"election:{name}", reason="test")
        rival_term = rival.election(name, lease=2.0).campaign(wait=5)
        wait_for(lambda: not lost.is_held, 3, "the loss seen by the heartbeat")
        sent_before = len(published)
        with caplog.at_level(logging.INFO, logger="django_dynlock.celery"):
            tick_for(beat, 1.5)  # the entry is due 7 times or so
        assert len(published) == sent_before
        assert not beat.may_send()
        assert any("ended" in r.getMessage() and "campaigning again" in r.getMessage() for r in caplog.records)
        # It campaigns again: elected once the rival resigns.
        rival_term.release()
        wait_for(lambda: tick_for(beat, 0.05) and len(published) > sent_before, 5, "a send after the rival resigned")
        assert beat.term is not None and beat.term.token > rival_term.token
    finally:
        beat.close()
        rival.close(release=True)


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]  # closed again when we return: connections are refused


@pytest.mark.parametrize("broken", ["missing table", "refused connection"])
def test_a_dynamodb_error_in_tick_never_raises_out_of_beat(local, published, settings, tmp_path, caplog, broken):
    alias = dict(settings.DYNLOCK["default"])
    if broken == "missing table":
        alias["TABLE_NAME"] = f"dynlock-missing-{uuid.uuid4().hex[:8]}"
    else:
        alias["ENDPOINT_URL"] = f"http://127.0.0.1:{closed_port()}"
    settings.DYNLOCK = {**settings.DYNLOCK, "broken": alias}
    beat = scheduler_for(beat_app_for(f"err-{uuid.uuid4().hex[:6]}", dynlock_beat_using="broken"), tmp_path)
    try:
        with caplog.at_level(logging.INFO, logger="django_dynlock"):
            intervals = tick_for(beat, 2.5)  # two looks at least, at the standby's cadence
        assert intervals and max(intervals) <= beat.election.poll
        assert published == []
        said = [r.getMessage() for r in caplog.records if r.name == "django_dynlock.celery"]
        assert any("standing by" in m for m in said), said
    finally:
        beat.close()


def test_a_term_that_times_out_never_ends_beat_and_it_leads_again_after(local, published, settings, tmp_path):
    """RedBeat #92: beat was killed when its lock timed out. Here every request of the
    leader's client is held past its read timeout (a DynamoDB that stopped answering):
    its renewals fail, its term runs out locally, and its ticks go on, sending nothing
    once the term has ended; when DynamoDB answers again it is elected again."""
    with FaultProxy(local.options.endpoint_url, max_seconds=60) as proxy:
        settings.DYNLOCK = {
            **settings.DYNLOCK,
            "proxied": {
                **settings.DYNLOCK["default"],
                "ENDPOINT_URL": proxy.endpoint_url,
                "CLIENT_CONFIG": {
                    "connect_timeout": 0.5,
                    "read_timeout": 0.5,
                    "retries": {"total_max_attempts": 1, "mode": "standard"},
                },
            },
        }
        name = f"timeout-{uuid.uuid4().hex[:6]}"
        beat = scheduler_for(beat_app_for(name, dynlock_beat_using="proxied"), tmp_path)
        try:
            wait_for(lambda: tick_for(beat, 0.05) and published, 5, "the first send")
            term = beat.term
            proxy.add_fault("delay", delay_seconds=1.5, times=100_000)
            ended_at = None
            deadline = time.monotonic() + 6.0  # the 2 s lease runs out, then 4 s or so of ticks
            while time.monotonic() < deadline:
                held_before = term.is_held
                sent_before = len(published)
                tick_for(beat, 0.05)
                if not held_before:
                    ended_at = ended_at or time.monotonic()
                    assert len(published) == sent_before, "sent after the term had ended"
            assert ended_at is not None and not term.is_held and term.lost_reason == "expired"
            proxy.clear_faults()
            wait_for(lambda: tick_for(beat, 0.05) and beat.may_send(), 2.0 + 3.0 + 3.0, "elected again")
            sent_before = len(published)
            wait_for(lambda: tick_for(beat, 0.05) and len(published) > sent_before, 2, "a send in the new term")
            assert beat.term.token > term.token
        finally:
            beat.close()


def test_the_scheduler_wrapped_is_beats_default_or_the_one_named(tmp_path):
    default = scheduler_for(beat_app_for("w"), tmp_path, lazy=True)
    assert isinstance(default, PersistentScheduler) and type(default).wrapped is PersistentScheduler
    named = scheduler_for(beat_app_for("w", dynlock_beat_scheduler="celery.beat:Scheduler"), tmp_path, lazy=True)
    assert type(named).wrapped is Scheduler and not isinstance(named, PersistentScheduler)
    # beat started with -S LeaderScheduler, beat_scheduler naming another (a project's
    # CELERY_BEAT_SCHEDULER): that one, unless dynlock_beat_scheduler names one.
    by_beat = scheduler_for(beat_app_for("w", beat_scheduler="celery.beat:Scheduler"), tmp_path, lazy=True)
    assert type(by_beat).wrapped is Scheduler
    assert "wraps -> celery.beat:Scheduler" in by_beat.info
    both = {"beat_scheduler": "celery.beat:Scheduler", "dynlock_beat_scheduler": "celery.beat:PersistentScheduler"}
    assert type(scheduler_for(beat_app_for("w", **both), tmp_path, lazy=True)).wrapped is PersistentScheduler
    for itself in ("django_dynlock.celery.LeaderScheduler", "django_dynlock.celery:LeaderScheduler", LeaderScheduler):
        app = beat_app_for("w", beat_scheduler=itself)
        assert type(scheduler_for(app, tmp_path, lazy=True)).wrapped is PersistentScheduler, itself
    made = LeaderScheduler.wrapping(PersistentScheduler, election="other", lease=6)
    custom = made(app=beat_app_for("w"), schedule_filename=str(tmp_path / "s"), lazy=True)
    assert custom.election_name == "other" and custom.lease == 6.0
    assert "election -> other" in custom.info
    with pytest.raises(InvalidArgument):
        LeaderScheduler.wrapping(made)
    with pytest.raises(InvalidArgument):
        LeaderScheduler.wrapping("json:dumps")


# -- dynlock.W005 ----------------------------------------------------------------------------


#: As django-celery-beat's schedulers module: its DatabaseScheduler sleeps 5 s at most,
#: set in its __init__ from this constant rather than as a class attribute.
DEFAULT_MAX_INTERVAL = 5


class DatabaseLikeScheduler(Scheduler):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.max_interval = kwargs.get("max_interval") or self.app.conf.beat_max_loop_interval or DEFAULT_MAX_INTERVAL


def w005(settings, **values) -> list[checks.CheckMessage]:
    for name, value in values.items():
        setattr(settings, name, value)
    return [m for m in checks.run_checks(tags=["dynlock"]) if m.id == "dynlock.W005"]


def test_w005_when_beat_may_sleep_more_than_a_third_of_the_lease(settings):
    leader = "django_dynlock.celery.LeaderScheduler"
    assert w005(settings, CELERY_BEAT_MAX_LOOP_INTERVAL=300) == []  # no LeaderScheduler: not ours
    found = w005(settings, CELERY_BEAT_SCHEDULER=leader, CELERY_DYNLOCK_BEAT_LEASE=9, CELERY_BEAT_MAX_LOOP_INTERVAL=10)
    assert len(found) == 1 and "10s" in found[0].msg and "9s" in found[0].msg
    assert "3 or less" in found[0].hint
    assert w005(settings, CELERY_BEAT_MAX_LOOP_INTERVAL=3) == []
    # Unset: beat's PersistentScheduler sleeps up to 300 s.
    del settings.CELERY_BEAT_MAX_LOOP_INTERVAL
    found = w005(settings)
    assert len(found) == 1 and "300s" in found[0].msg
    # A wrapping class, and the lease of the alias (LEASE_DURATION 12: a third is 4).
    del settings.CELERY_DYNLOCK_BEAT_LEASE
    settings.DYNLOCK = {"default": {**settings.DYNLOCK["default"], "LEASE_DURATION": 12.0}}
    wrapped = LeaderScheduler.wrapping(PersistentScheduler)
    assert len(w005(settings, CELERY_BEAT_SCHEDULER=wrapped, CELERY_BEAT_MAX_LOOP_INTERVAL=5)) == 1
    assert w005(settings, CELERY_BEAT_MAX_LOOP_INTERVAL=4) == []
    # Unset, with a scheduler whose module sets its default (django-celery-beat's 5 s).
    del settings.CELERY_BEAT_MAX_LOOP_INTERVAL
    settings.CELERY_BEAT_SCHEDULER = leader
    found = w005(settings, CELERY_DYNLOCK_BEAT_SCHEDULER="tests.test_celery_beat:DatabaseLikeScheduler")
    assert len(found) == 1 and " 5s " in found[0].msg
    assert w005(settings, CELERY_DYNLOCK_BEAT_LEASE=15) == []


def test_w005_is_logged_when_beat_starts(tmp_path, caplog):
    app = beat_app_for("w", dynlock_beat_lease=9)
    app.conf.beat_max_loop_interval = 0  # unset: 300 s
    with caplog.at_level(logging.WARNING, logger="django_dynlock.celery"):
        scheduler_for(app, tmp_path, lazy=True)  # beat's banner: not the scheduler that runs
        assert not caplog.records
        scheduler_for(app, tmp_path)
    assert any("dynlock.W005" in r.getMessage() and "300s" in r.getMessage() for r in caplog.records)
