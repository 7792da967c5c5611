"""Child process of ``bench.listing``: time GETs of the admin's "Leases" changelist.

    python -m bench.admin_page ENDPOINT_URL TABLE GETS

Runs the demo project's settings (``testproject.settings``) with an in-memory SQLite
database and DYNLOCK pointed at ``ENDPOINT_URL`` and ``TABLE``; one superuser logged in
with Django's test client. Prints one JSON line: the times of each GET (the first is a
warm-up), the API calls one GET makes, the rows shown and whether there is a next page.
"""

from __future__ import annotations

import json
import sys
import time


def configure_django(endpoint_url: str, table: str) -> None:
    """Django's settings: the demo project's, with a database and a DYNLOCK of our own."""
    from django.conf import settings

    from bench.clients import REGION, SESSION_OPTIONS
    from testproject import settings as demo

    values = {name: getattr(demo, name) for name in dir(demo) if name.isupper()}
    values.update(
        DEBUG=False,
        ALLOWED_HOSTS=["testserver"],
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
        DYNLOCK={
            "default": {
                "ENDPOINT_URL": endpoint_url,
                "TABLE_NAME": table,
                "REGION_NAME": REGION,
                "SESSION_OPTIONS": dict(SESSION_OPTIONS),
            }
        },
    )
    settings.configure(**values)


def main(endpoint_url: str, table: str, gets: int) -> dict:
    configure_django(endpoint_url, table)
    import django

    django.setup()
    from django.core.management import call_command
    from django.test import Client
    from django.test.utils import setup_test_environment
    from django.urls import reverse

    setup_test_environment()
    call_command("migrate", verbosity=0, interactive=False, run_syncdb=True)
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.create_superuser("bench", "bench@example.invalid", "bench-pw")
    browser = Client()
    browser.force_login(user)
    url = reverse("admin:django_dynlock_lease_changelist")

    from django_dynlock import get_lock_client

    calls: list[str] = []
    get_lock_client().boto.meta.events.register(
        "before-call.dynamodb", lambda model, **_: calls.append(model.name), unique_id="bench-admin-count"
    )

    times: list[float] = []
    per_get: list[int] = []
    body = b""
    for _ in range(max(2, gets + 1)):
        calls.clear()
        t0 = time.perf_counter()
        response = browser.get(url)
        times.append(time.perf_counter() - t0)
        per_get.append(len(calls))
        if response.status_code != 200:
            raise SystemExit(f"GET {url}: HTTP {response.status_code}")
        body = response.content
    text = body.decode("utf-8", "replace")
    import statistics

    measured = times[1:]
    return {
        "url": url,
        "gets": len(measured),
        "seconds": measured,
        "warmup_s": times[0],
        "median_s": statistics.median(measured),
        "calls_per_get": statistics.median(per_get[1:]),
        "call_names": sorted(set(calls)),
        "rows_shown": text.count('name="_selected_action"'),
        "has_next_page": "cursor=" in text,
        "bytes": len(body),
    }


if __name__ == "__main__":
    if len(sys.argv) != 4:
        raise SystemExit(__doc__.split("\n\n")[1])
    print(json.dumps(main(sys.argv[1], sys.argv[2], int(sys.argv[3]))))
