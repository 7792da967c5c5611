"""The demo app: concurrent bookings through the locked view never oversell."""

from __future__ import annotations

import threading

import pytest
from django.db import connection
from django.test import Client

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
