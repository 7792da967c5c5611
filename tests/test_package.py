"""The package as users get it: ``python -m build`` makes an sdist and a wheel, and the
wheel, installed into a fresh venv with nothing from the checkout on the path, runs
``manage.py check``, ``migrate`` and ``createlocktable`` against DynamoDB Local.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import venv
import zipfile
from pathlib import Path

import pytest

import django_dynlock
from localdynamo.servers import DUMMY_CREDENTIALS, DUMMY_REGION, dummy_client, table_name

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow

SETTINGS = """
SECRET_KEY = "package-test"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1"]
INSTALLED_APPS = [
    "django.contrib.admin", "django.contrib.auth", "django.contrib.contenttypes",
    "django.contrib.sessions", "django.contrib.messages", "django_dynlock",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [{
    "BACKEND": "django.template.backends.django.DjangoTemplates", "APP_DIRS": True,
    "OPTIONS": {"context_processors": [
        "django.template.context_processors.request",
        "django.contrib.auth.context_processors.auth",
        "django.contrib.messages.context_processors.messages",
    ]},
}]
ROOT_URLCONF = "site_urls"
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": "db.sqlite3"}}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
"""


MANAGE = """
import os
import sys

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "site_settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
"""

URLS = """
from django.contrib import admin
from django.urls import path

urlpatterns = [path("admin/", admin.site.urls)]
"""


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """The sdist and the wheel, built the way a release is (the wheel from the sdist)."""
    out = tmp_path_factory.mktemp("dist")
    built = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(ROOT)], capture_output=True, text=True, timeout=300
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    # setuptools' deprecation warnings (e.g. license classifiers) are part of the output
    assert "SetuptoolsDeprecationWarning" not in built.stdout + built.stderr
    return out


def only(folder: Path, pattern: str) -> Path:
    (found,) = folder.glob(pattern)
    return found


def test_the_wheel_and_the_sdist_carry_everything_an_install_needs(dist):
    version = django_dynlock.__version__
    wheel = only(dist, f"django_dynlock-{version}-py3-none-any.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    info = f"django_dynlock-{version}.dist-info"
    for needed in (
        "django_dynlock/py.typed",
        "django_dynlock/migrations/0001_initial.py",
        "django_dynlock/management/commands/createlocktable.py",
        "django_dynlock/templates/admin/django_dynlock/lease/change_list.html",
        f"{info}/licenses/LICENSE",
    ):
        assert needed in names, needed
    assert not [n for n in names if n.startswith(("tests/", "bench/", "testproject/"))]
    metadata = zipfile.ZipFile(wheel).read(f"{info}/METADATA").decode()
    assert "License-Expression: BSD-3-Clause" in metadata
    assert "Requires-Dist: Django>=5.2" in metadata and "Classifier: Framework :: Django :: 6.1" in metadata
    assert "# django-dynlock" in metadata  # README as the long description

    sdist = only(dist, f"django_dynlock-{version}.tar.gz")
    members = {m.split("/", 1)[1] for m in tarfile.open(sdist).getnames() if "/" in m}
    for needed in (
        "LICENSE",
        "README.md",
        "CHANGELOG.md",
        "pyproject.toml",
        "django_dynlock/py.typed",
        "django_dynlock/templates/admin/django_dynlock/lease/change_list.html",
    ):
        assert needed in members, needed


def test_the_installed_wheel_runs_check_migrate_and_createlocktable(dist, dynamodb_local_server, tmp_path):
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    wheel = only(dist, "django_dynlock-*.whl")
    installed = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--no-compile", str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert installed.returncode == 0, installed.stderr[-3000:]

    site = tmp_path / "site"
    site.mkdir()
    table = table_name()
    dynlock = {
        "default": {
            "TABLE_NAME": table,
            "ENDPOINT_URL": dynamodb_local_server.endpoint_url,
            "REGION_NAME": DUMMY_REGION,
            "SESSION_OPTIONS": DUMMY_CREDENTIALS,
        }
    }
    (site / "site_settings.py").write_text(SETTINGS + f"DYNLOCK = {dynlock!r}\n")
    (site / "site_urls.py").write_text(URLS)
    (site / "manage.py").write_text(MANAGE)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "DJANGO_SETTINGS_MODULE")}
    env["PYTHONNOUSERSITE"] = "1"

    def run(*args: str) -> subprocess.CompletedProcess:
        # run from the site folder: the checkout is neither the cwd nor on sys.path
        return subprocess.run([str(python), *args], cwd=site, env=env, capture_output=True, text=True, timeout=120)

    where = run(
        "-c", "import django_dynlock, sys; print(django_dynlock.__file__); print(sys.path)"
    )  # cwd is on the path
    assert where.returncode == 0, where.stderr
    assert where.stdout.startswith(str(env_dir)) and str(ROOT) not in where.stdout, where.stdout
    try:
        check = run("manage.py", "check")
        assert check.returncode == 0, check.stdout + check.stderr
        migrate = run("manage.py", "migrate", "--noinput")
        assert migrate.returncode == 0 and "django_dynlock" in migrate.stdout, migrate.stdout + migrate.stderr
        created = run("manage.py", "createlocktable")
        assert created.returncode == 0 and f"Creating table {table!r}" in created.stdout, (
            created.stdout + created.stderr
        )
        shown = run("manage.py", "showlocks")
        assert shown.returncode == 0, shown.stdout + shown.stderr
        assert (
            dummy_client(dynamodb_local_server.endpoint_url).describe_table(TableName=table)["Table"]["TableStatus"]
            == "ACTIVE"
        )
    finally:
        try:
            dummy_client(dynamodb_local_server.endpoint_url).delete_table(TableName=table)
        except Exception:
            pass
