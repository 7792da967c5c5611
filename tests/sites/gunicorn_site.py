"""A one-module Django site for the gunicorn crash scenario (tests/test_gunicorn.py).

Settings, URLs and views in one place; the lock settings come from the environment
(``SITE_ENDPOINT_URL``, ``SITE_TABLE``, ``SITE_LEASE``) and are otherwise the defaults.
Run it as gunicorn does: ``DJANGO_SETTINGS_MODULE=tests.sites.gunicorn_site gunicorn
tests.sites.gunicorn_site:application``.
"""

from __future__ import annotations

import os
import time

from localdynamo.servers import suite_region, suite_session_options

SECRET_KEY = "gunicorn-site"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1"]
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "django_dynlock"]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
ROOT_URLCONF = __name__
USE_TZ = True
DYNLOCK = {
    "default": {
        "ENDPOINT_URL": os.environ.get("SITE_ENDPOINT_URL"),
        "TABLE_NAME": os.environ.get("SITE_TABLE", "django_dynlock"),
        "LEASE_DURATION": float(os.environ.get("SITE_LEASE", "30")),
        "HEARTBEAT_PERIOD": float(os.environ.get("SITE_LEASE", "30")) / 3,
        "REGION_NAME": suite_region(),
        "SESSION_OPTIONS": suite_session_options(),
    }
}

from django.core.wsgi import get_wsgi_application  # noqa: E402
from django.http import HttpRequest, JsonResponse  # noqa: E402
from django.urls import path  # noqa: E402

from django_dynlock import dynamo_lock  # noqa: E402


def _held(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"pid": os.getpid(), "token": dynamo_lock.current().token})


@dynamo_lock("event:{event_id}", wait=10)
def book(request: HttpRequest, event_id: int) -> JsonResponse:
    """The view of the report: waits up to 10 s for the event's lock."""
    return _held(request)


@dynamo_lock("event:{event_id}")
def try_book(request: HttpRequest, event_id: int) -> JsonResponse:
    """The default wait (WAIT_TIMEOUT 0): one attempt, 423 when busy."""
    return _held(request)


@dynamo_lock("event:{event_id}", wait=10)
def hold(request: HttpRequest, event_id: int) -> JsonResponse:
    """Hold the lock for ``?seconds=`` (the worker is killed meanwhile)."""
    time.sleep(min(float(request.GET.get("seconds", "1")), 120.0))
    return _held(request)


urlpatterns = [
    path("book/<int:event_id>/", book),
    path("try/<int:event_id>/", try_book),
    path("hold/<int:event_id>/", hold),
]

application = get_wsgi_application()
