"""Running the management commands in-process, for the tests in tests/commands/."""

from __future__ import annotations

import io
import sys
import time
from types import SimpleNamespace
from typing import Any

import pytest
from django.core.management import BaseCommand, CommandError, call_command

from django_dynlock import LockClient, get_lock_client

UNREACHABLE = "http://127.0.0.1:9"
# Most behaviour does not depend on the server: run it on moto only. dynalite (no TTL,
# no item on a failed condition, tables CREATING for 500 ms) keeps the core cases.
MOTO = pytest.mark.parametrize("server", ["moto"], indirect=True)
FAST_FAIL = {"connect_timeout": 0.5, "read_timeout": 1, "retries": {"total_max_attempts": 1, "mode": "standard"}}


def run(*args: Any, **options: Any) -> SimpleNamespace:
    """call_command with captured output."""
    out, err = io.StringIO(), io.StringIO()
    call_command(*args, stdout=out, stderr=err, **options)
    return SimpleNamespace(out=out.getvalue(), err=err.getvalue())


def fails(*args: Any, **options: Any) -> CommandError:
    with pytest.raises(CommandError) as caught:
        run(*args, **options)
    assert "\n" not in str(caught.value), "error messages are one line"
    return caught.value


def other_client(client: LockClient) -> LockClient:
    """A second, independent client on the same table: another process, as far as locks go."""
    return LockClient(client.options)


class Probe(BaseCommand):
    """An inner command that reports what it saw while running under runlocked."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[dict[str, Any]] = []

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--key", default="k")
        parser.add_argument("--exit", type=int)
        parser.add_argument("--sys-exit", type=int)
        parser.add_argument("--crash", action="store_true")
        parser.add_argument("--sleep", type=float, default=0.0)
        parser.add_argument("--break-own-lock", action="store_true")
        parser.add_argument("--interrupt", action="store_true")

    def handle(self, *args: Any, **options: Any) -> None:
        client = get_lock_client()
        lease = self.dynlock_lease
        self.seen.append({"lease": lease, "info": client.get(options["key"])})
        time.sleep(options["sleep"])
        self.seen[-1]["held_at_end"] = lease.is_held
        self.stdout.write("probe ran")
        if options["break_own_lock"]:
            breaker = other_client(client)
            breaker.break_lease(options["key"], reason="test")
            breaker.close()
        if options["exit"] is not None:
            raise CommandError("probe failed", returncode=options["exit"])
        if options["sys_exit"] is not None:
            sys.exit(options["sys_exit"])
        if options["crash"]:
            raise ValueError("probe crashed")
        if options["interrupt"]:
            raise KeyboardInterrupt
