"""The Celery app of tests/test_celery_beat.py's ``celery beat`` processes: the app of
tests/support/celery_app.py (kombu's filesystem transport in DYNLOCK_CELERY_DIR, Django
configured on DYNLOCK_TEST_ENDPOINT_URL / DYNLOCK_TEST_TABLE, a 2 s lease) with a
schedule of one task every second. No worker consumes it: the test reads what each beat
sent from the broker's folder."""

from __future__ import annotations

import os

from tests.support.celery_app import app

__all__ = ["ENTRY", "INTERVAL", "app", "beat_tick"]

#: The one schedule entry, and its interval (seconds).
ENTRY = "every-second"
INTERVAL = 1.0

app.conf.update(
    beat_schedule={ENTRY: {"task": "tests.support.beat_app.beat_tick", "schedule": INTERVAL}},
    # At most a third of the 2 s lease (dynlock.W005): a tick twice a second.
    beat_max_loop_interval=0.5,
    dynlock_beat_election=os.environ.get("DYNLOCK_BEAT_ELECTION", "beat-test"),
)


@app.task(name="tests.support.beat_app.beat_tick")
def beat_tick() -> None:
    """Sent by the leading beat; never run (no worker)."""
