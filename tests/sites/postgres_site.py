"""The test project on PostgreSQL, for tests/test_postgresql.py.

``python -m tests.sites.postgres_site`` (with ``DJANGO_SETTINGS_MODULE`` set to this
module, and ``PG_PORT``, ``SITE_ENDPOINT_URL``, ``SITE_TABLE`` in the environment)
migrates, holds the key ``job:\\x00`` and breaks it through the admin as an operator
would, then prints what happened as JSON: the response's status, whether the lease is
still held, and the admin log's entries.
"""

from __future__ import annotations

import json
import os

from localdynamo.servers import suite_region, suite_session_options
from tests.settings import *  # noqa: F401,F403 (the test project, on another database)

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "HOST": "127.0.0.1",
        "PORT": os.environ.get("PG_PORT", "5432"),
        "NAME": "postgres",
        "USER": "dynlock",
    }
}
DYNLOCK = {
    "default": {
        "ENDPOINT_URL": os.environ.get("SITE_ENDPOINT_URL"),
        "REGION_NAME": suite_region(),
        "SESSION_OPTIONS": suite_session_options(),
        "TABLE_NAME": os.environ.get("SITE_TABLE", "django_dynlock"),
    }
}
ALLOWED_HOSTS = ["testserver"]


def main() -> None:
    import django

    django.setup()
    from django.contrib.admin.models import LogEntry
    from django.contrib.admin.utils import quote
    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.test import Client
    from django.urls import reverse

    from django_dynlock import get_lock_client

    call_command("migrate", verbosity=0)
    call_command("createlocktable", verbosity=0)
    lease = get_lock_client().acquire("job:\x00", lease=30)
    browser = Client(raise_request_exception=False)
    browser.force_login(User.objects.create_superuser("ops", password="not-used"))
    url = reverse("admin:django_dynlock_lease_break", args=(quote("job:\x00"),))
    response = browser.post(url, {"token": str(lease.token), "reason": "stuck\x00 since noon"})
    entries = list(LogEntry.objects.values("object_id", "object_repr", "change_message"))
    print(json.dumps({"status": response.status_code, "held": lease.is_held, "entries": entries}))


if __name__ == "__main__":
    main()
