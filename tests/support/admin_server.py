"""The test project served for real, for the browser test (tests/test_admin_browser.py).

This module is both the server's settings module and its launcher:

    python -m tests.support.admin_server PORT

with ``DYNLOCK_BROWSER_ENDPOINT``, ``DYNLOCK_BROWSER_TABLE`` and ``DYNLOCK_BROWSER_DB``
in the environment migrates a fresh SQLite database, creates the staff user
``operator`` (password ``operator-pw``) with exactly the ``view_lease`` and
``break_lease`` permissions and the superuser ``reviewer`` (password ``reviewer-pw``, who
can open Django's own pages to compare the lease pages with), and runs ``runserver`` (no reloader, static files served)
on 127.0.0.1:PORT. ``start_admin_server()`` does all that in a subprocess and waits
until the login page answers; ``AdminServer.stop()`` ends it.

The project is the demo's (``testproject``: its apps and URLs), with DEBUG off so that a
server error shows as a plain 500 page, never as a debug page.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from localdynamo.servers import DUMMY_CREDENTIALS, DUMMY_REGION, REPO_ROOT  # noqa: E402

# -- settings (read by Django when DJANGO_SETTINGS_MODULE is this module) --------------------
# The demo's apps, middleware, templates and URLs; its own database, table and endpoint.
from testproject.settings import *  # noqa: E402,F401,F403

SECRET_KEY = "browser-test-only"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
DATABASES = {
    "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": os.environ.get("DYNLOCK_BROWSER_DB", ":memory:")}
}
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # test speed only
DYNLOCK = {
    "default": {
        "TABLE_NAME": os.environ.get("DYNLOCK_BROWSER_TABLE", "django_dynlock"),
        "ENDPOINT_URL": os.environ.get("DYNLOCK_BROWSER_ENDPOINT", "http://127.0.0.1:9"),
        "REGION_NAME": DUMMY_REGION,
        "SESSION_OPTIONS": DUMMY_CREDENTIALS,
    }
}

# -- launcher -------------------------------------------------------------------------------
USERNAME = "operator"
PASSWORD = "operator-pw"
SUPERUSER = "reviewer"
SUPERUSER_PASSWORD = "reviewer-pw"
START_TIMEOUT = 90.0  # seconds: migrate + runserver start
START_ATTEMPTS = 3  # fresh ports, when the server dies at once (port taken meanwhile)
STOP_TIMEOUT = 5.0


def serve(port: int) -> None:
    """In the child: migrate, create the operator, serve until killed."""
    os.environ["DJANGO_SETTINGS_MODULE"] = __name__ if __name__ != "__main__" else "tests.support.admin_server"
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Permission
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)
    user, _ = get_user_model().objects.get_or_create(username=USERNAME, defaults={"is_staff": True})
    user.set_password(PASSWORD)
    user.save()
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="django_dynlock", codename__in=["view_lease", "break_lease"])
    )
    get_user_model().objects.create_superuser(SUPERUSER, password=SUPERUSER_PASSWORD)
    call_command("runserver", f"127.0.0.1:{port}", use_reloader=False, use_threading=True, insecure_serving=True)


class AdminServer:
    def __init__(self, process: subprocess.Popen, port: int, log_path: str, workdir: str):
        self.process = process
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = log_path
        self.workdir = workdir

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(Path(self.log_path).read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if self.process.poll() is not None:
                return  # reaped: its group id may be someone else's by now
            try:
                os.killpg(self.process.pid, sig)
            except (ProcessLookupError, PermissionError):
                return
            try:
                self.process.wait(timeout=STOP_TIMEOUT)
                return
            except subprocess.TimeoutExpired:
                continue

    def __enter__(self) -> AdminServer:
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()


def _ready(server: AdminServer, deadline: float) -> str | None:
    """None once the login page answers 200; otherwise why not ("exited" if it died)."""
    last = "no answer"
    for _ in range(int(START_TIMEOUT / 0.2) + 2):
        if server.process.poll() is not None:
            return "exited"
        try:
            with urllib.request.urlopen(f"{server.url}/admin/login/", timeout=2) as reply:
                if reply.status == 200:
                    return None
                last = f"HTTP {reply.status}"
        except (urllib.error.URLError, OSError) as exc:
            last = str(exc)
        if time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    return f"not ready in {START_TIMEOUT:.0f}s ({last})"


def start_admin_server(endpoint_url: str, table: str, workdir: str) -> AdminServer:
    """Serve the test project against ``table`` at ``endpoint_url``; its database lives in ``workdir``."""
    from localdynamo.servers import free_port, server_env

    failures = []
    deadline = time.monotonic() + START_TIMEOUT
    for attempt in range(START_ATTEMPTS):
        port = free_port()
        env = server_env(
            {
                "DJANGO_SETTINGS_MODULE": "tests.support.admin_server",
                "DYNLOCK_BROWSER_ENDPOINT": endpoint_url,
                "DYNLOCK_BROWSER_TABLE": table,
                "DYNLOCK_BROWSER_DB": os.path.join(workdir, f"db-{port}.sqlite3"),
                "PYTHONUNBUFFERED": "1",
            }
        )
        log = tempfile.NamedTemporaryFile(prefix=f"dynlock-admin-{port}-", suffix=".log", dir=workdir, delete=False)
        try:
            process = subprocess.Popen(
                [sys.executable, "-m", "tests.support.admin_server", str(port)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=str(REPO_ROOT),
                start_new_session=True,
                close_fds=True,
            )
        finally:
            log.close()
        server = AdminServer(process, port, log.name, workdir)
        reason = _ready(server, deadline)
        if reason is None:
            return server
        server.stop()
        failures.append(f"attempt {attempt + 1} on port {port}: {reason}\n{server.log_tail()}")
        if reason != "exited" or time.monotonic() >= deadline:
            break
    raise RuntimeError("the admin test server did not start:\n" + "\n".join(failures))


if __name__ == "__main__":
    serve(int(sys.argv[1]))
