"""Settings for the django-dynlock demo project (``make run``).

NOT for production: DEBUG is on and the secret key is public.
"""

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
DEMO_DIR = BASE_DIR / ".demo"
DEMO_DIR.mkdir(exist_ok=True)

SECRET_KEY = "django-insecure-dynlock-demo-only-do-not-use-in-production"
DEBUG = True
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "[::1]"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_dynlock",
    "testproject.booking",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "testproject.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.debug",
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

WSGI_APPLICATION = "testproject.wsgi.application"
ASGI_APPLICATION = "testproject.asgi.application"

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": DEMO_DIR / "db.sqlite3",
    }
}

AUTH_PASSWORD_VALIDATORS = []  # demo: admin/admin must be accepted

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = DEMO_DIR / "static"

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# The demo talks to a local moto server started by scripts/demo.py.
DYNLOCK = {
    "default": {
        "TABLE_NAME": "django_dynlock",
        "ENDPOINT_URL": os.environ.get("DYNLOCK_ENDPOINT_URL", "http://127.0.0.1:8001"),
        "REGION_NAME": "us-east-1",
        "SESSION_OPTIONS": {
            "aws_access_key_id": "demo",
            "aws_secret_access_key": "demo",
        },
    }
}
