"""Child process of ``bench.listing``: time GETs of the admin's "Leases" changelist.

Runs under ``tests.settings`` with ``DYNLOCK_TEST_ENDPOINT_URL`` / ``DYNLOCK_TEST_TABLE``
set by the parent; an in-memory SQLite database, one superuser logged in with Django's
test client. Prints one JSON line: the times of each GET (the first is a warm-up), the
API calls one GET makes, the rows shown and whether there is a next page.
"""

from __future__ import annotations

import json
import os
import sys
import time


def main(gets: int) -> dict:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command
    from django.test import Client
    from django.test.utils import setup_test_environment
    from django.urls import reverse

    settings.ALLOWED_HOSTS = ["testserver"]
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
    result = main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
    print(json.dumps(result))
