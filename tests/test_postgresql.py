"""The admin's break on PostgreSQL, the database most Django sites run.

PostgreSQL refuses NUL in text, which SQLite stores: a key holding one (``job:\\x00``)
was broken, then its admin log entry failed to write, a 500 after the fact (issue 14).
The server is Debian's PostgreSQL, started for this module on loopback in a temporary
folder (``make postgresql`` installs it as root; CI does).
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from localdynamo.servers import dummy_client, free_port, table_name
from tests.support.tools import missing_tool

ROOT = Path(__file__).resolve().parent.parent


def _bin(name: str) -> str | None:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return found[-1] if found else shutil.which(name)


@pytest.fixture(scope="module")
def postgres():
    initdb, pg_ctl = _bin("initdb"), _bin("pg_ctl")
    if not initdb or not pg_ctl:
        missing_tool("PostgreSQL is not installed: run `make postgresql` (apt-get install postgresql, as root)")
    try:
        import psycopg  # noqa: F401
    except ImportError:
        missing_tool("psycopg is not installed: pip install -e '.[dev]'")
    # Not under pytest's folder: its parents are root's alone.
    folder = Path(tempfile.mkdtemp(prefix="dynlock-pg-"))
    # PostgreSQL will not run as root; Debian's package adds the user "postgres".
    run_as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    if run_as:
        shutil.chown(folder, "postgres")
    port = free_port()
    data = folder / "data"
    subprocess.run(
        [*run_as, initdb, "-D", str(data), "-A", "trust", "-U", "dynlock", "--no-sync"],
        check=True,
        capture_output=True,
        timeout=60,
    )
    subprocess.run(
        [
            *run_as,
            pg_ctl,
            "-D",
            str(data),
            "-o",
            f"-h 127.0.0.1 -p {port} -k {folder} -F",
            "-l",
            str(folder / "log"),
            "-w",
            "-t",
            "30",
            "start",
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    try:
        yield port
    finally:
        subprocess.run([*run_as, pg_ctl, "-D", str(data), "-m", "immediate", "stop"], capture_output=True, timeout=60)
        shutil.rmtree(folder, ignore_errors=True)


def test_breaking_a_key_with_a_nul_writes_its_admin_log_entry_on_postgresql(postgres, moto_server):
    table = table_name()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.sites.postgres_site",
        "PG_PORT": str(postgres),
        "SITE_ENDPOINT_URL": moto_server.endpoint_url,
        "SITE_TABLE": table,
        "PYTHONPATH": str(ROOT),
    }
    try:
        done = subprocess.run(
            [sys.executable, "-m", "tests.sites.postgres_site"],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        dummy_client(moto_server.endpoint_url).delete_table(TableName=table)
    assert done.returncode == 0, done.stderr[-3000:]
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert outcome["status"] == 302, done.stderr[-3000:]
    assert outcome["held"] is False
    [entry] = outcome["entries"]
    assert entry["object_repr"] == "job:\\x00" and "stuck\\x00 since noon" in entry["change_message"]
