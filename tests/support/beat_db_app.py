"""The Celery app of tests/test_celery_beat.py's django-celery-beat test: the app of
tests/support/celery_app.py with Django's database in the SQLite file
DYNLOCK_BEAT_DATABASE (django-celery-beat's tables in it, shared by the two beats), and
``beat_scheduler`` set to its DatabaseScheduler as a project's ``CELERY_BEAT_SCHEDULER``
would be; beat is started with ``-S django_dynlock.celery.LeaderScheduler``. No schedule
in the configuration: the periodic task is a row that :func:`setup` stores.

``python -m tests.support.beat_db_app`` runs :func:`setup` (before any beat starts).
"""

from __future__ import annotations

import os

from tests.support.celery_app import app

__all__ = ["ELECTION", "ENTRY", "INTERVAL", "TASK", "app", "db_tick", "setup"]

#: The periodic task's name in the database, its task, and its interval (seconds).
ENTRY = "every-second-in-the-database"
TASK = "tests.support.beat_db_app.db_tick"
INTERVAL = 1
ELECTION = os.environ.get("DYNLOCK_BEAT_ELECTION", "beat-db-test")

app.conf.update(
    beat_schedule={},
    beat_scheduler="django_celery_beat.schedulers:DatabaseScheduler",
    # At most a third of the 2 s lease (dynlock.W005): a tick twice a second.
    beat_max_loop_interval=0.5,
    dynlock_beat_election=ELECTION,
)


@app.task(name=TASK)
def db_tick() -> None:
    """Sent by the leading beat; never run (no worker)."""


def setup() -> None:
    """Django's tables in the database file, and the one periodic task, due every second."""
    from django.core.management import call_command
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    call_command("migrate", verbosity=0)
    every, _ = IntervalSchedule.objects.get_or_create(every=INTERVAL, period=IntervalSchedule.SECONDS)
    PeriodicTask.objects.update_or_create(name=ENTRY, defaults={"task": TASK, "interval": every})


if __name__ == "__main__":
    setup()
