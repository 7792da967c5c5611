"""The demo app: concurrent bookings through the locked view never oversell."""

from __future__ import annotations

import copy
import datetime as dt
import threading

import pytest
from django.db import connection
from django.test import Client

from django_dynlock.management.formatting import CLOCK_ERROR
from testproject.booking.models import Booking, Event


def close_thread_connection() -> None:
    """Close this thread's own connection to the test database.

    Django ignores ``close()`` on an in-memory SQLite database (closing the last connection
    would drop it), so each request thread's connection was left to the garbage collector:
    an unclosed-database ResourceWarning on Python 3.13, an error under our filterwarnings.
    The main thread's connection keeps the shared in-memory database alive.
    """
    if connection.vendor == "sqlite" and connection.is_in_memory_db():
        if connection.connection is not None:
            connection.connection.close()
            connection.connection = None
    else:
        connection.close()


@pytest.mark.django_db(transaction=True)
def test_concurrent_bookings_through_the_locked_view_never_oversell(dynlock):
    event = Event.objects.create(name="Last seats", seats_left=3)
    statuses = []

    def book(i):
        try:
            reply = Client().post(f"/demo/events/{event.pk}/book/", {"name": f"guest {i}", "think": 0.01})
            statuses.append(reply.status_code)
        finally:
            close_thread_connection()

    threads = [threading.Thread(target=book, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(statuses) == [200] * 3 + [409] * 5
    assert Booking.objects.filter(event=event).count() == 3
    assert Event.objects.get(pk=event.pk).seats_left == 0
    tokens = list(Booking.objects.order_by("id").values_list("token", flat=True))
    assert tokens == sorted(tokens)


@pytest.mark.django_db
def test_event_page_renders(dynlock, client):
    event = Event.objects.create(name="<b>Gig</b>", seats_left=2)
    page = client.get(f"/demo/events/{event.pk}/")
    assert page.status_code == 200 and b"&lt;b&gt;Gig&lt;/b&gt;" in page.content


def load_demo_script():
    import importlib.util

    from localdynamo.servers import REPO_ROOT

    spec = importlib.util.spec_from_file_location("demo_script", REPO_ROOT / "scripts" / "demo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # defines; main() runs only as a script
    return module


@pytest.mark.django_db
def test_make_runs_banner_names_the_demo_page_and_it_is_there(dynlock, client):
    # issue 31: the banner listed only the admin
    demo = load_demo_script()
    lines = demo.banner("http://127.0.0.1:8001", "moto")
    demo_line = next(line for line in lines if line.strip().startswith("Demo:"))
    admin_line = next(line for line in lines if line.strip().startswith("Admin:"))
    assert lines.index(demo_line) < lines.index(admin_line)
    assert f"http://127.0.0.1:8000{demo.DEMO_PATH}" in demo_line
    page = client.get(demo.DEMO_PATH)  # the event the demo's migration creates
    assert page.status_code == 200 and b"The last five seats" in page.content


# -- the run's indicator (issue 31: nothing showed that a run was going) ------------------------
@pytest.mark.django_db
def test_the_status_names_the_holder_of_the_events_lock_then_says_it_is_free(dynlock, client):
    event = Event.objects.create(name="Gig", seats_left=2)
    key = f"event:{event.pk}"
    lease = dynlock.acquire(key, lease=30, holder={"view": "testproject.booking.views.book_view", "user": "7"})
    status = client.get(f"/demo/events/{event.pk}/status/").json()
    assert status["seats_left"] == 2 and status["bookings"] == 0
    lock = status["lock"]
    info = dynlock.get(key)
    assert lock["key"] == key and lock["held"] is True
    assert lock["token"] == str(lease.token)  # a string: JavaScript's numbers are exact to 2**53 only
    assert lock["holder"] == f"testproject.booking.views.book_view (user 7) on {info.host}:{info.pid}"
    assert lock["lease_seconds"] == 30
    # Two estimates of DynamoDB's clock (the holder's, the page's) from Date headers of one
    # second's resolution: a lease of 30 s may show up to 31 s left.
    assert 0 <= lock["held_for"] < 10 and 20 < lock["expires_in"] <= 30 + CLOCK_ERROR
    when = {name: dt.datetime.fromisoformat(lock[name]) for name in ("acquired_at", "now", "expires_at")}
    assert all(value.utcoffset() == dt.timedelta(0) for value in when.values())
    assert abs((when["expires_at"] - when["acquired_at"]).total_seconds() - 30) <= CLOCK_ERROR
    assert lock["admin_url"] == f"/admin/django_dynlock/lease/?q=event%3A{event.pk}&refresh=1"
    lease.release()
    lock = client.get(f"/demo/events/{event.pk}/status/").json()["lock"]
    assert lock["held"] is False and "holder" not in lock and "error" not in lock


@pytest.mark.django_db
def test_the_status_says_when_dynamodb_cannot_be_read(dynlock, client, settings):
    event = Event.objects.create(name="Gig", seats_left=2)
    broken = copy.deepcopy(settings.DYNLOCK)
    broken["default"]["TABLE_NAME"] = dynlock.options.table_name + "-missing"
    settings.DYNLOCK = broken
    reply = client.get(f"/demo/events/{event.pk}/status/")
    assert reply.status_code == 200  # the page keeps polling and shows why
    lock = reply.json()["lock"]
    assert lock["held"] is False and "-missing" in lock["error"] and "createlocktable" in lock["error"]


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["book", "book-unlocked"])
@pytest.mark.parametrize("think", ["1.5", "-0.1", "nan", "soon"])
def test_a_payment_time_out_of_range_is_refused(mock_dynlock, client, path, think):
    event = Event.objects.create(name="Gig", seats_left=2)
    reply = client.post(f"/demo/events/{event.pk}/{path}/", {"think": think})
    assert reply.status_code == 400
    assert reply.json() == {"booked": False, "reason": "think must be a number of seconds from 0 to 1.0"}
    assert Event.objects.get(pk=event.pk).seats_left == 2


@pytest.mark.django_db
def test_the_event_page_offers_the_payment_times_and_links_to_the_admin_on_its_key(mock_dynlock, client):
    event = Event.objects.create(name="Gig", seats_left=2)
    text = client.get(f"/demo/events/{event.pk}/").content.decode()
    assert f'<code id="lock-key">event:{event.pk}</code>' in text
    assert f'href="/admin/django_dynlock/lease/?q=event%3A{event.pk}&amp;refresh=1"' in text
    assert '<option value="1">1 s</option>' in text


RUN_DEMO = """
import sys
sys.path.insert(0, "scripts")
import demo
demo.WEB_PORT, demo.DYNAMODB_PORT = {web}, {dynamodb}
sys.exit(demo.main())
"""


@pytest.mark.slow
def test_ctrl_c_stops_the_demo_and_exits_0():
    # issue 35: Ctrl-C made scripts/demo.py exit 130, and `make run` ended with "Error 130".
    # A terminal's Ctrl-C is a SIGINT to the whole foreground process group.
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    from localdynamo.servers import free_port, port_is_free

    web, dynamodb = free_port(), free_port()
    demo = subprocess.Popen(
        [sys.executable, "-c", RUN_DEMO.format(web=web, dynamodb=dynamodb)],
        cwd=Path(__file__).parents[1],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        # as from a shell: SIGINT not ignored, whatever this process does with it
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        lines = []
        deadline = time.monotonic() + 240
        assert demo.stdout is not None
        for line in demo.stdout:
            lines.append(line)
            if "Press Ctrl-C to stop." in line or time.monotonic() > deadline:
                break
        while port_is_free(web) and time.monotonic() < deadline:  # runserver is starting
            time.sleep(0.2)
        os.killpg(demo.pid, signal.SIGINT)
        out, _ = demo.communicate(timeout=60)
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
            demo.wait()
    output = "".join(lines) + out
    assert demo.returncode == 0, output
    assert "[demo] stopping (KeyboardInterrupt) ..." in output and "[demo] moto stopped" in output
    assert "Traceback" not in output
    assert port_is_free(web) and port_is_free(dynamodb)
