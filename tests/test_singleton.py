"""``@singleton_command``: the decorator form of ``runlocked``, on a real server."""

from __future__ import annotations

import io
import time
from typing import Any

import pytest
from django.core.management import BaseCommand, CommandError, call_command

from django_dynlock import LockClient, get_lock_client
from django_dynlock.singleton import singleton_command
from tests.support.aliases import alias_settings
from tests.support.tables import fresh_table

MOTO = pytest.mark.parametrize("server", ["moto"], indirect=True)


class Recorder(BaseCommand):
    """Remembers what ``handle`` saw: its lease and the table's view of it."""

    key = "command:test_singleton"

    def handle(self, *args: Any, **options: Any) -> str | None:
        self.lease = self.dynlock_lease
        self.info = get_lock_client(getattr(self, "alias", "default")).get(self.key)
        if options.get("fail"):
            raise CommandError("failed", returncode=4)
        self.stdout.write("ran")
        return None

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--fail", action="store_true")


class Bare(Recorder):
    handle = singleton_command(Recorder.handle)


class Configured(Recorder):
    key = "nightly-report"
    handle = singleton_command("nightly-report", lease=5.0, busy_exit=75)(Recorder.handle)


class KeptAtLeast(Recorder):
    handle = singleton_command(at_least=30.0)(Recorder.handle)


class OtherAlias(Recorder):
    alias = "reports"
    handle = singleton_command(using="reports")(Recorder.handle)


class Waits(Recorder):
    handle = singleton_command(wait=3.0)(Recorder.handle)


def run(command: BaseCommand, *args: str, **options: Any) -> str:
    out = io.StringIO()
    call_command(command, *args, stdout=out, stderr=io.StringIO(), **options)
    return out.getvalue()


def test_runs_handle_under_a_lease_named_after_the_command(dynlock):
    command = Bare()
    assert run(command) == "ran\n"
    assert command.info.key == "command:test_singleton"  # the command's module name, as Django names it
    assert command.info.holder == {"command": "test_singleton"}
    assert command.info.token == command.lease.token
    assert dynlock.get("command:test_singleton") is None
    assert Bare.handle.__name__ == "handle" and Bare.handle.__wrapped__ is Recorder.handle


@MOTO
def test_busy_skips_or_exits_with_busy_exit(dynlock):
    other = LockClient(dynlock.options)
    held = [other.acquire("command:test_singleton"), other.acquire("nightly-report")]
    try:
        command = Bare()
        assert run(command).startswith("Skipped: lock 'command:test_singleton' is busy (token ")
        assert not hasattr(command, "lease")
        with pytest.raises(CommandError) as caught:
            run(Configured())
        assert caught.value.returncode == 75 and "Skipped: lock 'nightly-report' is busy" in str(caught.value)
    finally:
        for lease in held:
            lease.release()
        other.close()


@MOTO
def test_options_reach_the_lease(dynlock):
    command = Configured()
    run(command)
    assert command.info.key == "nightly-report" and command.info.lease_seconds == 5.0


@MOTO
def test_at_least_keeps_the_lock(dynlock):
    started = time.monotonic()
    run(KeptAtLeast())
    # Returns at once (a sleep would take the whole 30 s): the stored expiry keeps the key. The
    # bound is half of at_least so that a loaded machine cannot fail it; 2 s was once 2.16 s in CI.
    assert time.monotonic() - started < 15.0
    kept = get_lock_client().get("command:test_singleton")
    assert kept is not None and 0 < kept.lease_seconds <= 30.0
    assert "Skipped" in run(Bare())


@MOTO
def test_wait(dynlock):
    other = LockClient(dynlock.options)
    held = other.acquire("command:test_singleton")
    import threading

    timer = threading.Timer(0.2, held.release)
    timer.start()
    try:
        assert run(Waits()) == "ran\n"
    finally:
        timer.cancel()
        other.close()


@MOTO
def test_errors_pass_through_and_release(dynlock):
    with pytest.raises(CommandError) as caught:
        run(Bare(), "--fail")
    assert caught.value.returncode == 4 and str(caught.value) == "failed"
    assert dynlock.get("command:test_singleton") is None


@MOTO
def test_using_another_alias(dynlock, settings):
    with fresh_table(settings, dynlock.server.endpoint_url, "reports"):
        command = OtherAlias()
        run(command)
        assert command.info is not None and command.info.key == "command:test_singleton"
        assert list(get_lock_client().leases(include_released=True)) == []


def test_unknown_alias_is_a_usage_error(settings):
    settings.DYNLOCK = {"default": alias_settings("http://127.0.0.1:9", "never-created")}
    with pytest.raises(CommandError) as caught:
        run(OtherAlias())
    assert caught.value.returncode == 2 and "unknown alias 'reports'" in str(caught.value)
