"""Django settings for the test suite. The DYNLOCK endpoint is replaced per test."""

from localdynamo.servers import DUMMY_CREDENTIALS, DUMMY_REGION

SECRET_KEY = "tests-only"
DEBUG = False
USE_TZ = True
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django_dynlock",
    "testproject.booking",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "testproject.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
# A fast hasher, as Django's testing docs advise: the default PBKDF2 costs about 0.3 s of CPU per
# user made with a password, and the admin tests make dozens. No test is about hashing.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Port 9 (discard) on loopback: a test that forgets its fixture fails fast instead of
# reaching AWS.
DYNLOCK = {
    "default": {
        "ENDPOINT_URL": "http://127.0.0.1:9",
        "REGION_NAME": DUMMY_REGION,
        "SESSION_OPTIONS": DUMMY_CREDENTIALS,
    }
}

# Subprocess tests (`python manage.py ... --settings=tests.settings`) point the default
# alias at their test server through the environment.
import os  # noqa: E402

if os.environ.get("DYNLOCK_TEST_ENDPOINT_URL"):
    DYNLOCK["default"]["ENDPOINT_URL"] = os.environ["DYNLOCK_TEST_ENDPOINT_URL"]
    if os.environ.get("DYNLOCK_TEST_TABLE"):
        DYNLOCK["default"]["TABLE_NAME"] = os.environ["DYNLOCK_TEST_TABLE"]
