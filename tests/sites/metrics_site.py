"""A one-module Django site with ``django_dynlock.contrib.prometheus`` installed, for the
multiprocess scrape under gunicorn (tests/test_observability.py).

gunicorn must run with ``PROMETHEUS_MULTIPROC_DIR`` set: each worker writes its values
there, and ``/metrics`` sums them as prometheus_client's multiprocess docs say. The lock
settings come from the environment (``SITE_ENDPOINT_URL``, ``SITE_TABLE``).
"""

from __future__ import annotations

import os
import time

from localdynamo.servers import suite_region, suite_session_options

SECRET_KEY = "metrics-site"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1"]
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django_dynlock",
    "django_dynlock.contrib.prometheus",
]
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

from django.core.wsgi import get_wsgi_application  # noqa: E402
from django.http import HttpRequest, HttpResponse, JsonResponse  # noqa: E402
from django.urls import path  # noqa: E402
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest, multiprocess  # noqa: E402

from django_dynlock import dynamo_lock  # noqa: E402


@dynamo_lock("work:{n}", wait=5)
def work(request: HttpRequest, n: int) -> JsonResponse:
    # Held a moment: requests sent together are served by different workers.
    time.sleep(float(request.GET.get("seconds", "0")))
    return JsonResponse({"pid": os.getpid()})


def metrics(request: HttpRequest) -> HttpResponse:
    """prometheus_client's multiprocess recipe: every worker's values, summed per series."""
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)


urlpatterns = [path("work/<int:n>/", work), path("metrics", metrics)]

application = get_wsgi_application()
