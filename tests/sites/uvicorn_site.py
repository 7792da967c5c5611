"""A one-module Django site under uvicorn (tests/test_uvicorn.py, bench/asgi_waiters.py):
async views decorated with ``dynamo_lock``.

Settings, URLs and views in one place; the lock settings come from the environment
(``SITE_ENDPOINT_URL``, ``SITE_TABLE``) with the suite's short timeouts and one botocore
attempt, so a paused or failing DynamoDB answers within a second or two (the library's
defaults with ``SITE_DEFAULT_TIMEOUTS=1``). Run it as
``DJANGO_SETTINGS_MODULE=tests.sites.uvicorn_site uvicorn tests.sites.uvicorn_site:application``.
"""

from __future__ import annotations

import asyncio
import os
import time

from localdynamo.servers import suite_region, suite_session_options

SECRET_KEY = "uvicorn-site"
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
        "REGION_NAME": suite_region(),
        "SESSION_OPTIONS": suite_session_options(),
    }
}
if not os.environ.get("SITE_DEFAULT_TIMEOUTS"):  # bench/asgi_waiters.py measures the defaults
    DYNLOCK["default"]["CLIENT_CONFIG"] = {
        "connect_timeout": 1,
        "read_timeout": 2,
        "retries": {"total_max_attempts": 1, "mode": "standard"},
    }

from django.core.asgi import get_asgi_application  # noqa: E402
from django.http import HttpRequest, JsonResponse  # noqa: E402
from django.urls import path  # noqa: E402

from django_dynlock import dynamo_lock  # noqa: E402


def _held() -> JsonResponse:
    return JsonResponse({"pid": os.getpid(), "token": dynamo_lock.current().token})


@dynamo_lock("event:{event_id}")
async def try_book(request: HttpRequest, event_id: int) -> JsonResponse:
    """The default wait (WAIT_TIMEOUT 0): one attempt; 423 when busy, 503 when DynamoDB fails."""
    return _held()


@dynamo_lock("event:{event_id}", wait=2)
async def hold(request: HttpRequest, event_id: int) -> JsonResponse:
    """The issue's scenario: wait up to 2 s, then hold for ``?seconds=`` (0.1 by default)."""
    await asyncio.sleep(min(float(request.GET.get("seconds", "0.1")), 30.0))
    return _held()


async def probe(request: HttpRequest) -> JsonResponse:
    """Unrelated work beside the locked views: ``?n=`` hops to asyncio's default thread
    pool (``asyncio.to_thread``), one started every ``?every=`` seconds whether or not the
    ones before have come back (so a stalled pool shows in every hop it delays, not in
    one); each hop's time in seconds."""
    n = min(int(request.GET.get("n", "20")), 1000)
    every = min(float(request.GET.get("every", "0.05")), 1.0)

    async def hop() -> float:
        started = time.monotonic()
        await asyncio.to_thread(time.monotonic)
        return time.monotonic() - started

    hops = []
    for _ in range(n):
        hops.append(asyncio.ensure_future(hop()))
        await asyncio.sleep(every)
    return JsonResponse({"hops": list(await asyncio.gather(*hops))})


urlpatterns = [
    path("try/<int:event_id>/", try_book),
    path("hold/<int:event_id>/", hold),
    path("probe/", probe),
]

application = get_asgi_application()
