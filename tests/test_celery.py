"""Celery (issue 17) with a real worker: ``celery -A tests.support.celery_app worker``, prefork
pool of 2, in a child process, on kombu's filesystem transport (no broker server),
against DynamoDB Local. One worker for the module; every wait is bounded.

What each test proves is in its docstring; tests/support/celery_app.py has the tasks.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from io import StringIO
from pathlib import Path

import pytest

pytest.importorskip("celery")

from django.core.management import call_command  # noqa: E402
from kombu import Connection  # noqa: E402

from django_dynlock import InvalidArgument, LockClient, LockNotAcquired, dynamo_lock, get_lock_client  # noqa: E402
from django_dynlock.celery import AlreadyQueued  # noqa: E402
from django_dynlock.engine import ClientOptions  # noqa: E402
from localdynamo.servers import REPO_ROOT, suite_region, suite_session_options, table_name  # noqa: E402
from tests.support import celery_app as tasks  # noqa: E402
from tests.support import polling  # noqa: E402

pytestmark = pytest.mark.slow

# A killed pool process' key is free again within the lease + 3 s of its last write
# (docs/api.md, "Crashed holders"); a second for the test's own polling.
CRASH_BOUND = tasks.LEASE + 3.0 + 1.0


def wait_for(predicate, timeout: float, what: str, interval: float = 0.05):
    """Polled every 0.05 s: the tasks' events file and the lock table are read each time."""
    return polling.wait_for(predicate, timeout, what, interval)


@dataclass
class Worker:
    process: subprocess.Popen
    endpoint_url: str
    table: str
    folder: Path
    log: Path
    queue: str = "celery"

    def send(self, task, *args):
        """``task.apply_async(args)`` to this worker's queue, through its own folder."""
        with Connection("filesystem://", transport_options=tasks.transport_options(self.folder)) as connection:
            return task.apply_async(args, queue=self.queue, connection=connection)

    def tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-40:])


@contextlib.contextmanager
def started_worker(endpoint: str, table: str, folder: Path, queue: str = "celery", graceful: bool = True):
    """``celery -A tests.support.celery_app worker`` consuming ``queue``, ready, and stopped at the
    end: by a warm shutdown (SIGTERM, then SIGKILL after 2 s: it waits for tasks still running,
    a test's leftovers that nothing checks), or at once if not ``graceful``."""
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    env.update(
        DYNLOCK_CELERY_DIR=str(folder),
        DYNLOCK_TEST_ENDPOINT_URL=endpoint,
        DYNLOCK_TEST_TABLE=table,
        PYTHONPATH=str(REPO_ROOT),
    )
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / f"worker-{queue}.log"
    with open(log, "w") as out:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "tests.support.celery_app",
                "worker",
                "--pool=prefork",
                "--concurrency=2",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                "--loglevel=INFO",
                "-Q",
                queue,
                "-n",
                f"dynlock-{uuid.uuid4().hex[:6]}@%h",
            ],
            cwd=REPO_ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    running = Worker(process, endpoint, table, folder, log, queue)
    try:
        wait_for(lambda: process.poll() is not None or " ready." in log.read_text(errors="replace"), 60, "the worker")
        assert process.poll() is None, f"the worker exited:\n{running.tail()}"
        yield running
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM if graceful else signal.SIGKILL)
            try:
                process.wait(timeout=2)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=15)


@pytest.fixture(scope="session")
def broker_folder(tmp_path_factory) -> Path:
    """One broker folder for the session. pytest-django runs this module's database test
    before the rest, so ``worker`` may be set up twice; the tests' app keeps its producer
    connections for the first folder it was given (kombu's pools), so the folder stays."""
    return tmp_path_factory.mktemp("celery")


@pytest.fixture(scope="module")
def worker(dynamodb_local_server, broker_folder):
    """The module's worker, on the default queue, and its table."""
    folder = broker_folder
    table = table_name()
    endpoint = dynamodb_local_server.endpoint_url
    client = LockClient(
        ClientOptions(
            endpoint_url=endpoint,
            table_name=table,
            region_name=suite_region(),
            session_options=suite_session_options(),
        )
    )
    client.create_table(wait=True)
    client.close()
    tasks.use_folder(folder)
    with started_worker(endpoint, table, folder) as running:
        yield running


@pytest.fixture
def own_worker(worker, tmp_path):
    """A worker of its own (its own broker folder and queue) for a test that kills a pool
    process: billiard's pool may stall for good after one of its processes is killed
    mid-task, and no later test should depend on it. Send to it with ``own.send``."""
    queue = f"q-{uuid.uuid4().hex[:8]}"
    folder = tmp_path / "broker"
    with started_worker(worker.endpoint_url, worker.table, folder, queue, graceful=False) as own:
        yield own


@dataclass
class Run:
    """One test's view: the lock client on the worker's table, and a folder for events."""

    worker: Worker
    client: LockClient
    folder: Path

    def events(self, event: str | None = None) -> list[dict]:
        path = self.folder / "events.log"
        lines = path.read_text().splitlines() if path.exists() else []
        found = [json.loads(line) for line in lines if line.strip()]
        return [e for e in found if event is None or e["event"] == event]

    def wait_events(self, event: str, count: int, timeout: float) -> list[dict]:
        try:
            return wait_for(
                lambda: len(self.events(event)) >= count and self.events(event), timeout, f"{count} {event}"
            )
        except AssertionError as error:
            raise AssertionError(f"{error}; events: {self.events()}\nworker log:\n{self.worker.tail()}") from None

    def wait_free(self, key: str, timeout: float, worker: Worker | None = None) -> float:
        """Seconds until ``key`` is free, within ``timeout``; on failure, the holder and the
        log of ``worker`` (the module's worker unless given) say why."""
        started = time.monotonic()
        try:
            wait_for(lambda: self.client.get(key) is None, timeout, f"{key} to be free")
        except AssertionError as error:
            log = (worker or self.worker).tail()
            raise AssertionError(f"{error}; held by {self.client.get(key)!r}\nworker log:\n{log}") from None
        return time.monotonic() - started


@pytest.fixture
def run(worker, settings, tmp_path):
    settings.DYNLOCK = tasks.dynlock_settings(worker.endpoint_url, worker.table)
    tmp_path.chmod(0o777)
    yield Run(worker, get_lock_client(), tmp_path)
    assert worker.process.poll() is None, f"the worker exited:\n{worker.tail()}"


def showlocks(prefix: str) -> str:
    out = StringIO()
    call_command("showlocks", "--prefix", prefix, stdout=out)
    return out.getvalue()


def test_six_locked_tasks_run_one_at_a_time_and_all_complete(run):
    """dynamo_lock(on_busy="retry") on a bound task: six delay() calls on two pool
    processes never overlap, each task ends, and the busy ones were retried (not failed)."""
    slot = uuid.uuid4().hex[:8]
    sent = [tasks.locked_step.delay(slot, str(run.folder), 0.3).id for _ in range(6)]
    ends = run.wait_events("end", 6, 60)
    starts = run.events("start")
    assert sorted(e["task_id"] for e in ends) == sorted(sent)
    first_starts = {}
    for start in starts:
        first_starts.setdefault(start["task_id"], start)
    spans = sorted((s["time"], e["time"], s["token"]) for s in starts for e in ends if e["task_id"] == s["task_id"])
    assert len(spans) == 6  # each task started once: a busy attempt never reached the body
    for (_, end, token), (start, _, next_token) in zip(spans, spans[1:]):
        assert end <= start, f"overlapping runs: {spans}"
        assert next_token > token
    assert any(s["retries"] > 0 for s in starts), "no task was ever busy: the test proves nothing"


def test_queue_once_queues_one_task_per_key_and_again_after_it_finished(run, admin_client):
    """QueueOnce: of five delay() calls one is queued and four raise AlreadyQueued (with
    the holder and a retry-after); showlocks and the admin name the task and its id; the task gets the
    enqueue's fencing token; once it finished, a sixth delay() is queued again."""
    user = uuid.uuid4().hex[:8]
    key = f"report:{user}"
    # It runs 3 s: "running counts too" below needs the task still running after the test has
    # seen its start (1 s once ended first in a faster run).
    queued = tasks.once_report.delay(user, str(run.folder), 3.0)
    token = run.client.get(key).token
    for _ in range(4):
        with pytest.raises(AlreadyQueued) as busy:
            tasks.once_report.delay(user, str(run.folder), 1.0)
        assert busy.value.key == key and busy.value.retry_after > 0
        assert busy.value.holder.holder == {"task": "tests.support.celery_app.once_report", "task_id": queued.id}
    shown = showlocks("report:")
    assert "tests.support.celery_app.once_report" in shown and f"task_id={queued.id}" in shown
    page = admin_client.get("/admin/django_dynlock/lease/").content.decode()
    assert "tests.support.celery_app.once_report" in page and f"task id {queued.id}" in page

    start = run.wait_events("start", 1, 30)[0]
    assert start["task_id"] == queued.id and start["token"] == token
    with pytest.raises(AlreadyQueued):  # running counts too
        tasks.once_report.delay(user, str(run.folder), 1.0)
    run.wait_events("end", 1, 30)
    run.wait_free(key, 5)
    again = tasks.once_report.delay(user, str(run.folder), 0.0)
    ends = run.wait_events("end", 2, 30)
    assert [e["task_id"] for e in ends] == [queued.id, again.id]
    assert len(run.events("start")) == 2
    run.wait_free(key, 5)


def test_a_queue_once_task_that_retries_keeps_its_key_until_the_retry_ends(run):
    """self.retry() hands the running task's lease to the retry's message: while the retry
    waits for its countdown the key stays taken, the retry runs with the same fencing
    token, and its end frees the key."""
    user = uuid.uuid4().hex[:8]
    key = f"retrying:{user}"
    queued = tasks.once_retrying.delay(user, str(run.folder))
    first = run.wait_events("start", 1, 30)[0]
    assert first["retries"] == 0
    time.sleep(0.5)  # the first run has ended with Retry; the retry waits 1.5 s
    assert len(run.events("start")) == 1
    with pytest.raises(AlreadyQueued):
        tasks.once_retrying.delay(user, str(run.folder))
    starts = run.wait_events("start", 2, 30)
    assert [s["task_id"] for s in starts] == [queued.id, queued.id]
    assert starts[1]["retries"] == 1 and starts[1]["token"] == first["token"] is not None
    run.wait_events("end", 1, 30)
    run.wait_free(key, 5)


def test_a_revoked_queue_once_task_frees_its_key_without_running(run):
    """Revoked while its countdown runs: the worker never runs it, and its main process
    releases the lease the message carried (not its 60 s timeout). A countdown, because
    Celery checks for a revoke when it hands a task to the pool: a task queued behind busy
    pool processes may already be handed over (in order) before the revoke arrives."""
    user = uuid.uuid4().hex[:8]
    # Long enough for the broadcast revoke to reach the worker (the filesystem broker polls)
    # on a loaded machine: with 2 s it once arrived after the countdown, and the task ran.
    countdown = 4
    queued = tasks.once_report.apply_async((user, str(run.folder), 0.0), countdown=countdown)
    tasks.app.control.revoke(queued.id)
    # Freed when the countdown ends and the worker discards the task, not after 60 s.
    assert run.wait_free(f"report:{user}", countdown + 8) < countdown + 4
    time.sleep(0.5)
    assert queued.id not in {e["task_id"] for e in run.events("start")}


def test_a_message_whose_lease_is_gone_takes_the_key_afresh_or_runs_unlocked(run, caplog):
    """A message that outlived its lease (queued past its timeout, or delivered again
    after a crash): it takes the key afresh when free, and runs all the same, with a
    warning, when someone else holds it. Run in this process (apply), headers as sent."""
    from django_dynlock.celery import HEADER

    user = uuid.uuid4().hex[:8]
    key = f"report:{user}"
    stale = run.client.acquire(key, lease=1).hand_over()
    assert run.client.release_handover(stale)
    headers = {HEADER: {**stale.as_dict(), "alias": "default"}}
    tasks.once_report.apply((user, str(run.folder), 0.0), headers=headers)
    start = run.events("start")[-1]
    assert start["token"] is not None and start["token"] > stale.token  # a lease of its own, released since
    assert run.client.get(key) is None and "runs without its once lease" not in caplog.text

    with run.client.acquire(key):
        tasks.once_report.apply((user, str(run.folder), 0.0), headers=headers)
    assert run.events("start")[-1]["token"] is None and len(run.events("end")) == 2
    assert "runs without its once lease" in caplog.text


def test_graceful_queue_once_returns_none_and_sends_nothing(run):
    user = uuid.uuid4().hex[:8]
    with run.client.acquire(f"graceful:{user}"):
        assert tasks.graceful_report.delay(user) is None


@pytest.mark.parametrize("task", ["soft_limited", "soft_limited_once"])
def test_a_task_at_its_soft_time_limit_releases_its_lock(run, task):
    """The lease (30 s, renewed) is released when SoftTimeLimitExceeded ends the task:
    without the release the key stays held as long as the pool process lives."""
    name = uuid.uuid4().hex[:8]
    key = f"soft:{name}" if task == "soft_limited" else f"soft-once:{name}"
    getattr(tasks, task).delay(name, str(run.folder))
    assert run.wait_events("start", 1, 30)[0]["token"] is not None  # held, as the task saw it
    run.wait_events("soft-limit", 1, 10)
    assert run.wait_free(key, 3) < 3


def test_a_queue_once_task_killed_at_its_hard_time_limit_frees_its_key(run, own_worker):
    """The worker's main process releases the lease the killed task's message carried,
    long before the task's 30 s lease would run out."""
    name = uuid.uuid4().hex[:8]
    own_worker.send(tasks.hard_limited_once, name, str(run.folder))
    run.wait_events("start", 1, 30)
    assert run.client.get(f"hard-once:{name}") is not None
    run.wait_free(f"hard-once:{name}", 8, own_worker)


def test_a_pool_process_killed_mid_task_does_not_block_the_key_past_crash_recovery(run, own_worker):
    """SIGKILL to the pool process running a locked task (an OOM kill): nothing releases
    the key, and any process takes it within the lease + 3 s. Before the kill, showlocks
    shows the task and its id as the holder, on the pool process."""
    name = uuid.uuid4().hex[:8]
    key = f"victim:{name}"
    result = own_worker.send(tasks.crash_victim, name, str(run.folder))
    start = run.wait_events("start", 1, 30)[0]
    shown = showlocks("victim:")
    assert "tests.support.celery_app.crash_victim" in shown and f"task_id={result.id}" in shown
    assert f":{start['pid']}" in shown
    os.kill(start["pid"], signal.SIGKILL)
    killed = time.monotonic()
    lease = wait_for(lambda: run.client.try_acquire(key), CRASH_BOUND + 2, "the key after the crash", interval=0.2)
    took = time.monotonic() - killed
    lease.release()
    assert took <= CRASH_BOUND, f"the key was blocked {took:.1f}s after the kill"
    assert not run.events("end")


def test_the_package_imports_nothing_from_celery_until_asked():
    """Without django_dynlock.celery, the package, the decorator on a plain function
    and the commands leave Celery unimported (it is an optional extra)."""
    code = (
        "import django, sys; django.setup()\n"
        "import django_dynlock.admin, django_dynlock.management.commands.showlocks\n"
        "from django_dynlock import dynamo_lock\n"
        "dynamo_lock('k')(lambda: None)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('celery', 'kombu', 'billiard')))\n"
    )
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="tests.settings", PYTHONPATH=str(REPO_ROOT))
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_a_queue_once_task_whose_pool_process_is_killed_frees_its_key_at_once(run, own_worker):
    """WorkerLostError: the worker's main process releases the lease the message carried
    once it reports the lost process (worker_lost_wait, 1 s here), long before the task's
    30 s lease (renewed by the dead process until the kill) would run out."""
    name = uuid.uuid4().hex[:8]
    own_worker.send(tasks.once_victim, name, str(run.folder))
    start = run.wait_events("start", 1, 30)[0]
    assert run.client.get(f"once-victim:{name}").pid == start["pid"]  # adopted by the pool process
    os.kill(start["pid"], signal.SIGKILL)
    assert run.wait_free(f"once-victim:{name}", 10, own_worker) < 5


def test_retry_past_max_retries_fails_the_task_with_lock_not_acquired(run):
    """on_busy="retry" counts against max_retries; past it, the task fails with the
    LockNotAcquired (run eagerly here: Celery retries at once, in this process)."""
    name = uuid.uuid4().hex[:8]
    with run.client.acquire(f"retry-once:{name}"):
        result = tasks.retry_once.apply((name,))
    assert result.failed() and isinstance(result.result, LockNotAcquired)
    assert tasks.retry_once.apply((name,)).get() == "ran"
    with pytest.raises(InvalidArgument, match="no task is running"):
        _busy_outside_a_task(run)


def test_a_semaphore_on_a_task_retries_when_every_slot_is_held(run):
    """dynamo_lock(limit=2, on_busy="retry") on a task (issue 38): on_busy works unchanged."""
    name = uuid.uuid4().hex[:8]
    held = run.client.acquire(f"limited:{name}", limit=2)
    assert tasks.limited_retry.apply((name,)).get() == 1 - held.slot  # the other slot
    with run.client.acquire(f"limited:{name}", limit=2):
        result = tasks.limited_retry.apply((name,))
    assert result.failed() and isinstance(result.result, LockNotAcquired)
    held.release()


def _busy_outside_a_task(run) -> None:
    @dynamo_lock("outside:{n}", on_busy="retry")
    def locked(n):
        return n

    with run.client.acquire("outside:1"):
        locked(1)
