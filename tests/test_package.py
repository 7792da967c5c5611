"""The package as users get it: ``python -m build`` makes an sdist and a wheel, and the
wheel, installed into a fresh venv with nothing from the checkout on the path, runs
``manage.py check``, ``migrate`` and ``createlocktable`` against DynamoDB Local.
"""

from __future__ import annotations

import configparser
import email.parser
import os
import shutil
import subprocess
import sys
import tarfile
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

import django_dynlock
from localdynamo.servers import DUMMY_CREDENTIALS, DUMMY_REGION, dummy_client, table_name

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.slow, pytest.mark.background]

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


# What a checkout holds besides its source: venvs, npm's and the builds' output, and the
# caches and logs written while the suite runs (lint runs beside it in CI).
NOT_SOURCE = (
    ".git",
    ".venv*",
    "node_modules",
    ".demo",
    "*.egg-info",
    "build",
    "dist",
    "__pycache__",
    "results",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
    ".hypothesis",
    ".test-latest.log",
)


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """The sdist and the wheel, built the way a release is (the wheel from the sdist)."""
    out = tmp_path_factory.mktemp("dist")
    # From a copy of the checkout: setuptools writes its egg-info and the sdist's release
    # tree in the source folder, where another build (a developer's, another checkout's
    # test run) would remove them under it. Twice in parallel runs a copy into the tree
    # failed with "No such file or directory: 'django_dynlock-0.1.0/tests/...'".
    source = tmp_path_factory.mktemp("source") / "django-dynlock"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*NOT_SOURCE))
    built = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(source)], capture_output=True, text=True, timeout=300
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
        "django_dynlock/static/django_dynlock/lease_refresh.js",  # the list's auto-refresh
        "django_dynlock/locale/fr/LC_MESSAGES/django.mo",  # compiled: no gettext needed to install
        "django_dynlock/locale/fr/LC_MESSAGES/django.po",
        "django_dynlock/contrib/prometheus/apps.py",  # the observability apps (docs/observability.md)
        "django_dynlock/contrib/opentelemetry/apps.py",
        f"{info}/licenses/LICENSE",
    ):
        assert needed in names, needed
    assert not [n for n in names if n.startswith(("tests/", "bench/", "testproject/"))]
    metadata = zipfile.ZipFile(wheel).read(f"{info}/METADATA").decode()
    assert "# django-dynlock" in metadata  # README as the long description

    sdist = only(dist, f"django_dynlock-{version}.tar.gz")
    members = {m.split("/", 1)[1] for m in tarfile.open(sdist).getnames() if "/" in m}
    for needed in (
        "LICENSE",
        "README.md",
        "CHANGELOG.md",
        "pyproject.toml",
        "setup.cfg",
        "django_dynlock/py.typed",
        "django_dynlock/templates/admin/django_dynlock/lease/change_list.html",
        "django_dynlock/static/django_dynlock/lease_refresh.js",
        "django_dynlock/locale/fr/LC_MESSAGES/django.mo",
        "django_dynlock/locale/fr/LC_MESSAGES/django.po",
    ):
        assert needed in members, needed


def test_the_wheel_metadata_comes_from_setup_cfg(dist):
    """The supported versions, URLs and keywords as pip and the package index see them, and
    setup.cfg as their only source: pyproject.toml has no [project] table, so a setup.cfg the
    build did not read would leave the wheel without them."""
    assert "project" not in tomllib.loads((ROOT / "pyproject.toml").read_text())
    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read(ROOT / "setup.cfg")

    wheel = only(dist, f"django_dynlock-{django_dynlock.__version__}-py3-none-any.whl")
    info = f"django_dynlock-{django_dynlock.__version__}.dist-info"
    metadata = email.parser.Parser().parsestr(zipfile.ZipFile(wheel).read(f"{info}/METADATA").decode())

    assert metadata["Name"] == "django-dynlock" and metadata["Version"] == django_dynlock.__version__
    assert metadata["License-Expression"] == "BSD-3-Clause"
    assert metadata["Requires-Python"] == ">=3.11"
    requires = {Requirement(r).name: Requirement(r) for r in metadata.get_all("Requires-Dist") if "extra ==" not in r}
    assert set(requires) == {"Django", "boto3"}
    django_range = requires["Django"].specifier
    for admitted in ("5.2", "5.2.8", "6.0", "6.1", "6.1.3"):
        assert django_range.contains(admitted), (admitted, django_range)
    for refused in ("4.2", "4.2.26", "5.1"):
        assert not django_range.contains(refused), (refused, django_range)

    classifiers = metadata.get_all("Classifier")
    assert classifiers == cfg["metadata"]["classifiers"].strip().splitlines()
    for version in ("5.2", "6.0", "6.1"):
        assert f"Framework :: Django :: {version}" in classifiers
    assert not [c for c in classifiers if c.startswith("Framework :: Django :: 4")]
    for version in ("3.11", "3.12", "3.13"):
        assert f"Programming Language :: Python :: {version}" in classifiers
    assert "Typing :: Typed" in classifiers

    urls = dict(url.split(", ", 1) for url in metadata.get_all("Project-URL"))
    assert set(urls) == {"Homepage", "Documentation", "Changelog", "Issues"}
    assert all(url.startswith("https://") for url in urls.values())
    keywords = metadata["Keywords"].split(",")
    assert {"django", "dynamodb", "lock", "lease"} <= set(keywords)
    assert keywords == [k.strip() for k in cfg["metadata"]["keywords"].split(",")]

    extras = set(metadata.get_all("Provides-Extra"))
    assert {"celery", "testing", "dev", "prometheus", "otel"} <= extras
    optional = {
        Requirement(r).name.lower().replace("_", "-") for r in metadata.get_all("Requires-Dist") if "extra ==" in r
    }
    assert {"prometheus-client", "opentelemetry-api"} <= optional


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
