"""The Celery app of tests/test_celery.py: run by a real worker (``celery -A
tests.support.celery_app worker``) in a child process, and imported by the tests to send tasks.

No broker server: kombu's filesystem transport (with whole-message writes, see
AtomicFilesystemChannel) in the folder DYNLOCK_CELERY_DIR. The
worker is not a Django test process: it configures Django itself, with the default
alias on DYNLOCK_TEST_ENDPOINT_URL / DYNLOCK_TEST_TABLE. Tasks write what happens to
``events.log`` in the folder they are given (one JSON line per event, appended), so
no result backend is needed either.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path

from celery import Celery, Task
from celery.exceptions import SoftTimeLimitExceeded
from kombu.transport import TRANSPORT_ALIASES, filesystem
from kombu.utils.json import dumps

#: The lease of the default alias, in the worker and in the tests: a killed worker's key
#: is free again within LEASE + 3 s.
LEASE = 2.0


def dynlock_settings(endpoint_url: str, table: str) -> dict:
    from localdynamo.servers import suite_region, suite_session_options

    return {
        "default": {
            "ENDPOINT_URL": endpoint_url,
            "TABLE_NAME": table,
            "REGION_NAME": suite_region(),
            "SESSION_OPTIONS": suite_session_options(),
            "LEASE_DURATION": LEASE,
            "HEARTBEAT_PERIOD": 0.5,
            "CLIENT_CONFIG": {"connect_timeout": 1, "read_timeout": 2, "retries": {"total_max_attempts": 2}},
        }
    }


def _configure_django() -> None:
    from django.conf import settings

    if settings.configured or os.environ.get("DJANGO_SETTINGS_MODULE"):
        return  # the test process: pytest-django's settings
    import django

    # tests/support/beat_db_app.py: django-celery-beat's tables, in a SQLite file that the
    # two beats share.
    beat_database = os.environ.get("DYNLOCK_BEAT_DATABASE")
    settings.configure(
        INSTALLED_APPS=[
            "django.contrib.contenttypes",
            "django.contrib.auth",
            "django_dynlock",
            *(["django_celery_beat"] if beat_database else []),
        ],
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": beat_database or ":memory:"}},
        USE_TZ=True,
        DYNLOCK=dynlock_settings(os.environ["DYNLOCK_TEST_ENDPOINT_URL"], os.environ["DYNLOCK_TEST_TABLE"]),
    )
    django.setup()


_configure_django()

from django_dynlock import dynamo_lock  # noqa: E402
from django_dynlock.celery import QueueOnce  # noqa: E402

app = Celery("tests.support.celery_app")


class AtomicFilesystemChannel(filesystem.Channel):
    """kombu's filesystem channel, but a message enters the folder whole.

    kombu creates the message file, then writes it; a worker polling in between moves
    it away and reads it empty, and the JSONDecodeError ends the worker (seen once in a
    CI run). Written under a name the reader skips (no dot), then renamed.
    """

    def _put(self, queue: str, payload: dict, **kwargs: object) -> None:
        name = f"{int(round(time.monotonic() * 1000))}_{uuid.uuid4()}.{queue}.msg"
        writing = os.path.join(self.data_folder_out, f"writing-{uuid.uuid4().hex}")
        with open(writing, "wb") as out:
            out.write(dumps(payload).encode())
        os.replace(writing, os.path.join(self.data_folder_out, name))


class AtomicFilesystemTransport(filesystem.Transport):
    Channel = AtomicFilesystemChannel


TRANSPORT_ALIASES["dynlock-filesystem"] = f"{__name__}:AtomicFilesystemTransport"


def transport_options(folder: str | os.PathLike) -> dict:
    """kombu's filesystem transport in ``folder``: messages, exchange tables and read
    messages all inside it (by default read ones pass through the machine's /tmp)."""
    queue, processed = Path(folder, "queue"), Path(folder, "processed")
    queue.mkdir(parents=True, exist_ok=True)
    processed.mkdir(exist_ok=True)
    return {
        "data_folder_in": str(queue),
        "data_folder_out": str(queue),
        "control_folder": str(Path(folder, "control")),
        "store_processed": True,
        "processed_folder": str(processed),
        "polling_interval": 0.05,
    }


def use_folder(folder: str | os.PathLike) -> None:
    """Point the broker at ``folder`` (the worker's and the tests' app alike)."""
    app.conf.update(
        broker_url="dynlock-filesystem://",
        broker_transport_options=transport_options(folder),
        broker_connection_retry_on_startup=True,
        task_ignore_result=True,
        result_backend=None,
        worker_hijack_root_logger=False,
        worker_lost_wait=1.0,  # report a killed pool process after 1 s, not Celery's 10
    )


if os.environ.get("DYNLOCK_CELERY_DIR"):
    use_folder(os.environ["DYNLOCK_CELERY_DIR"])


def record(folder: str, event: str, **fields) -> None:
    """Append one event (a short line: one O_APPEND write, whole even between processes)."""
    line = json.dumps({"event": event, "time": time.time(), "pid": os.getpid(), **fields}) + "\n"
    with open(Path(folder, "events.log"), "a") as out:
        out.write(line)


def _hold(seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:  # bounded; a soft time limit interrupts it
        time.sleep(0.02)


@app.task(bind=True, max_retries=200)
@dynamo_lock("step:{slot}", on_busy="retry")
def locked_step(self, slot: str, folder: str, hold: float) -> None:
    """Runs one at a time per slot; a busy slot retries the task."""
    lease = dynamo_lock.current()
    record(folder, "start", task_id=self.request.id, token=lease.token, retries=self.request.retries)
    _hold(hold)
    record(folder, "end", task_id=self.request.id, token=lease.token)


@app.task(bind=True, base=QueueOnce, once={"key": "report:{user_id}", "timeout": 60})
def once_report(self, user_id: str, folder: str, hold: float) -> None:
    """Queued at most once at a time per user."""
    lease = self.once_lease
    record(folder, "start", task_id=self.request.id, token=lease.token if lease else None)
    _hold(hold)
    record(folder, "end", task_id=self.request.id)


@app.task(bind=True, base=QueueOnce, once={"key": "retrying:{user_id}", "timeout": 60}, max_retries=1)
def once_retrying(self, user_id: str, folder: str) -> None:
    """Retries once, 1.5 s later: its lease goes with the retry, so the key stays taken."""
    lease = self.once_lease
    record(folder, "start", task_id=self.request.id, token=lease.token if lease else None, retries=self.request.retries)
    if not self.request.retries:
        raise self.retry(countdown=1.5)
    record(folder, "end", task_id=self.request.id)


@app.task(base=QueueOnce, once={"key": "graceful:{user_id}", "graceful": True})
def graceful_report(user_id: str) -> None:
    """Its enqueue returns None while the key is busy."""


def _overrun_soft_limit(task: Task, folder: str, key: str) -> None:
    """Hold past the task's soft time limit, recording the start (with the token stored for
    ``key``, read here: a read by the test could come after the limit on a loaded machine)
    and the limit's exception."""
    from django_dynlock import get_lock_client

    held = get_lock_client().get(key)
    record(folder, "start", task_id=task.request.id, token=held.token if held else None)
    try:
        _hold(20)
    except SoftTimeLimitExceeded:
        record(folder, "soft-limit", task_id=task.request.id)
        raise


@app.task(bind=True, soft_time_limit=1)
@dynamo_lock("soft:{name}", lease=30)
def soft_limited(self, name: str, folder: str) -> None:
    """Overruns its soft time limit; its 30 s lease must not outlive it."""
    _overrun_soft_limit(self, folder, f"soft:{name}")


@app.task(bind=True, base=QueueOnce, once={"key": "soft-once:{name}", "timeout": 60, "lease": 30}, soft_time_limit=1)
def soft_limited_once(self, name: str, folder: str) -> None:
    """A QueueOnce task that overruns its soft time limit."""
    _overrun_soft_limit(self, folder, f"soft-once:{name}")


@app.task(bind=True, base=QueueOnce, once={"key": "hard-once:{name}", "timeout": 60, "lease": 30}, time_limit=1)
def hard_limited_once(self, name: str, folder: str) -> None:
    """A QueueOnce task killed at its hard time limit: the worker's main process frees its key."""
    record(folder, "start", task_id=self.request.id)
    _hold(20)


@app.task(bind=True)
@dynamo_lock("victim:{name}")
def crash_victim(self, name: str, folder: str) -> None:
    """Holds its key until its pool process is killed (the test sends SIGKILL)."""
    record(folder, "start", task_id=self.request.id)
    _hold(60)
    record(folder, "end", task_id=self.request.id)


@app.task(bind=True, base=QueueOnce, once={"key": "once-victim:{name}", "timeout": 60, "lease": 30})
def once_victim(self, name: str, folder: str) -> None:
    """A QueueOnce task whose pool process the test kills: the main process frees its key."""
    record(folder, "start", task_id=self.request.id)
    _hold(60)


@app.task(bind=True, max_retries=1)
@dynamo_lock("limited:{name}", limit=2, on_busy="retry")
def limited_retry(self, name: str) -> int:
    """At most two at a time per name (a semaphore); a third is retried once, then fails."""
    return dynamo_lock.current().slot


@app.task(bind=True, max_retries=1)
@dynamo_lock("retry-once:{name}", on_busy="retry")
def retry_once(self, name: str) -> str:
    """Retried once when busy; then fails with the LockNotAcquired."""
    return "ran"
