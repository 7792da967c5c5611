"""breaklock: breaking leases, asking first on a terminal."""

from __future__ import annotations

import io
import logging
import os
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from django_dynlock import signals
from django_dynlock.management.commands import breaklock
from tests.support.commands import MOTO, fails, run


@pytest.fixture
def broken_signals() -> Iterator[list[dict]]:
    received: list[dict] = []

    def receiver(sender: Any, **kwargs: Any) -> None:
        received.append(kwargs)

    signals.lock_broken.connect(receiver)
    yield received
    signals.lock_broken.disconnect(receiver)


@MOTO
@pytest.mark.parametrize("flag", ["--noinput", "--no-input"])
def test_breaklock_noinput(dynlock, other, broken_signals, caplog, flag):
    lease = other.acquire("stuck", holder={"command": "import_feed"})
    caplog.set_level(logging.WARNING)
    result = run("breaklock", "stuck", flag, "--reason", "import hung")
    # issue 31: one line per break (the lease as it was, and that it is broken)
    assert result.out.startswith(f"stuck: broken: token {lease.token}, held by import_feed on")
    assert len(result.out.splitlines()) == 1
    assert dynlock.get("stuck") is None
    [info] = [i for i in dynlock.leases(include_released=True) if i.key == "stuck"]
    assert info.was_broken and info.break_reason == "import hung"
    assert info.released_by.endswith("(breaklock)") and "@" in info.released_by
    [sent] = broken_signals
    assert sent["key"] == "stuck" and sent["token"] == lease.token and sent["reason"] == "import hung"
    assert sent["by"] == info.released_by[len("break:") :]
    # one log line, in one wording: who broke whose lease, and why
    audit = [r.getMessage() for r in caplog.records if "broke" in r.getMessage()]
    assert len(audit) == 1 and sent["by"] in audit[0] and "import_feed" in audit[0] and "import hung" in audit[0]
    other.close()  # its lease was broken under it


def test_breaklock_several_keys_some_missing(dynlock, other):
    other.acquire("a"), other.acquire("b")
    error = fails("breaklock", "a", "missing", "b", "--noinput", "--reason", "test")
    assert error.returncode == 1 and "1 of 3 locks not broken: 'missing'" in str(error)
    assert dynlock.get("a") is None and dynlock.get("b") is None


@MOTO
def test_breaklock_output_lines(dynlock, other):
    lease = other.acquire("a")
    out = io.StringIO()
    with pytest.raises(CommandError):
        call_command("breaklock", "a", "missing", "--noinput", "--reason", "test", stdout=out)
    broken, missing = out.getvalue().splitlines()
    assert broken.startswith(f"a: broken: token {lease.token}, held by {os.uname().nodename}:{os.getpid()}, acquired ")
    assert missing == "missing: not broken: not found: no live lease or reservation on this key"


@MOTO
def test_breaklock_token(dynlock, other):
    lease = other.acquire("t")
    out = io.StringIO()
    with pytest.raises(CommandError) as caught:
        call_command("breaklock", "t", "--token", str(lease.token + 1), "--noinput", "--reason", "test", stdout=out)
    assert caught.value.returncode == 1 and dynlock.get("t") is not None
    # issue 31: the lease never changed; it said "it changed hands"
    said = f"t: not broken: --token {lease.token + 1} does not match: the lease has token {lease.token}, held by "
    assert said in out.getvalue()
    assert "changed hands" not in out.getvalue()
    run("breaklock", "t", "--token", str(lease.token), "--noinput", "--reason", "test")
    assert dynlock.get("t") is None


@MOTO
def test_breaklock_token_is_for_one_key(dynlock):
    error = fails("breaklock", "a", "b", "--token", "3", "--noinput")
    assert error.returncode == 2 and "--token applies to one KEY" in str(error)


@MOTO
@pytest.mark.parametrize("key", ["", "x" * 3000])
def test_breaklock_invalid_key(dynlock, key):
    assert fails("breaklock", key, "--noinput", "--reason", "test").returncode == 2


@MOTO
@pytest.mark.parametrize("answer, broken", [("y", True), ("YES", True), ("n", False), ("", False), (EOFError, False)])
def test_breaklock_asks(dynlock, other, monkeypatch, answer, broken):
    other.acquire("ask")
    prompts: list[str] = []

    def fake_input(prompt: str) -> str:
        prompts.append(prompt)
        if answer is EOFError:
            raise EOFError
        return answer

    monkeypatch.setattr(breaklock, "stdin_is_interactive", lambda: True)
    monkeypatch.setattr("builtins.input", fake_input)
    if broken:
        run("breaklock", "ask", "--reason", "test")
    else:
        assert fails("breaklock", "ask", "--reason", "test").returncode == 1
    assert prompts == ["Break the lease on 'ask'? [y/N] "]
    assert (dynlock.get("ask") is None) == broken


@MOTO
def test_breaklock_does_not_break_a_lease_that_changed_hands_while_asking(dynlock, other, monkeypatch):
    first = other.acquire("moving")

    def hand_over(prompt: str) -> str:
        first.release()
        other.acquire("moving")  # a new holder, a new token
        return "y"

    monkeypatch.setattr(breaklock, "stdin_is_interactive", lambda: True)
    monkeypatch.setattr("builtins.input", hand_over)
    out = io.StringIO()
    with pytest.raises(CommandError) as caught:
        call_command("breaklock", "moving", "--reason", "test", stdout=out)
    assert caught.value.returncode == 1
    assert "moving: not broken: gone: released or taken over since it was shown" in out.getvalue()
    assert dynlock.get("moving").token > first.token


@MOTO
def test_breaklock_without_a_terminal_needs_noinput(dynlock, monkeypatch):
    monkeypatch.setattr(breaklock, "stdin_is_interactive", lambda: False)
    error = fails("breaklock", "k")
    assert error.returncode == 2 and "pass --noinput" in str(error)


@MOTO
@pytest.mark.parametrize(
    "reason, said",
    [
        (None, "give a reason: --reason TEXT"),
        ("", "give a reason: --reason TEXT"),
        ("   ", "give a reason: --reason TEXT"),
        ("x" * 501, "--reason is too long: at most 500 characters, as in the admin"),
    ],
)
def test_breaklock_requires_a_reason_as_the_admin_does(dynlock, other, reason, said):
    # issue 31: the admin required a reason (at most 500 characters) and the command did not
    other.acquire("why")
    args = ["breaklock", "why", "--noinput"] + ([] if reason is None else ["--reason", reason])
    error = fails(*args)
    assert error.returncode == 2 and said in str(error)
    assert dynlock.get("why") is not None
    run("breaklock", "why", "--noinput", "--reason", "x" * 500)
    assert dynlock.get("why") is None
    other.close()  # its lease was broken under it
