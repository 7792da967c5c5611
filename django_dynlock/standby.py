"""``manage.py runlocked --standby KEY -- COMMAND``: run COMMAND for as long as this process leads.

Every copy of a service runs the same line; the copies campaign in the election KEY
(``client.election``, docs/election.md) and the leader runs COMMAND as a child process,
the others stand by at the election's cadence. The child never outlives the term:

- when renewals fail and the term's remaining local validity falls to ``grace`` plus
  ``STOP_SLACK``, the child's process group gets SIGTERM, and SIGKILL ``grace`` seconds
  later or ``STOP_SLACK`` before the validity ends, whichever comes first. The validity
  ends before any other process may be elected (docs/protocol.md), so the child is gone
  before another leader's child starts. Then this process campaigns again;
- a term lost outright (broken by an operator, or found lost on waking from a pause):
  SIGKILL at once, since another leader may already act;
- SIGTERM or SIGINT to ``runlocked``: the child is stopped the same way (SIGTERM, then
  SIGKILL after ``grace``), the term is resigned, and ``runlocked`` exits 0;
- the child exits by itself while leading: the term is resigned and ``runlocked`` exits
  with the child's code (128 + N for a child killed by signal N);
- ``runlocked`` itself killed (SIGKILL, an OOM kill): on Linux the kernel sends the child
  SIGKILL (``PR_SET_PDEATHSIG``).

Why a child process even for a management command (without ``--exec``): a command run
in this process through ``call_command`` cannot be stopped from outside. Python offers no
way to end a thread, and an exception raised into it by a signal handler may be caught
and ignored by the command, or arrive while it waits in C code. A process can be sent
SIGTERM and, if it does not stop in time, SIGKILL, which nothing in it can refuse.
"""

from __future__ import annotations

import ctypes
import enum
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from django.conf import settings
from django.core.management.base import BaseCommand
from django.utils.translation import gettext

from .engine.client import LockClient
from .engine.election import Election
from .engine.lease import Lease
from .exceptions import LockNotAcquired
from .management.base import lock_client, translated_errors, usage_error

_: Callable[[str], str] = gettext

logger = logging.getLogger("django_dynlock.standby")

#: The default ``--grace``, when the lease leaves room for it (else the most that fits).
DEFAULT_GRACE = 10.0
#: SIGKILL comes this long before the term's local validity ends, at the latest: time
#: for the kernel to end the child and for us to reap it, and for this loop's tick.
STOP_SLACK = 0.5
#: How far below ``lease * (1 - SAFETY_MARGIN) - heartbeat period`` a healthy term's
#: remaining validity may dip: a renewal's round trip, and the second that DynamoDB's
#: clock bounds take off a term's end (its ``Date`` headers are whole seconds).
RENEWAL_ALLOWANCE = 1.5
#: The shortest grace worth having: below it the lease is too short for a standby.
MIN_GRACE = 0.1
#: How often the leader looks at its child and its term (the on_lost callback wakes it sooner).
TICK = 0.1
#: A campaign is made of calls this long, so that a signal is acted on within it. The
#: election keeps its cadence between calls, so shorter calls send no more requests; at 0.5 s
#: a standby at load 9 took 1.8 s to leave after SIGTERM.
CAMPAIGN_CHUNK = 0.1
#: Environment variables the child finds: the election and its term's fencing token.
ELECTION_ENV = "DYNLOCK_ELECTION"
TOKEN_ENV = "DYNLOCK_TERM_TOKEN"

_PR_SET_PDEATHSIG = 1


class Outcome(enum.Enum):
    EXITED = "exited"  # the child ended by itself while leading
    ASKED = "asked"  # SIGTERM or SIGINT
    LOST = "lost"  # the term ended
    AT_RISK = "at risk"  # renewals fail and the validity left is short


def longest_grace(client: LockClient, lease: float) -> float:
    """The longest ``--grace`` that fits in a term of ``lease`` seconds.

    A healthy term's remaining validity never falls below ``lease * (1 - SAFETY_MARGIN)``
    minus a heartbeat period (its renewal is due then) minus ``RENEWAL_ALLOWANCE``. The
    child is sent SIGTERM once the validity left is ``grace + STOP_SLACK``: that must be
    below this floor, or a healthy term would stop its child at every renewal.
    """
    options = client.options
    period = min(options.heartbeat_period, lease / 3.0)
    return lease * (1.0 - options.safety_margin) - period - RENEWAL_ALLOWANCE - STOP_SLACK


def exit_status(returncode: int) -> int:
    """A child's return code as a shell reports it: 128 + N for a child killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def describe_status(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = str(-returncode)
        return _("killed by %(signal)s") % {"signal": name}
    return _("exit code %(code)s") % {"code": returncode}


def parent_death_signal(parent: int) -> Callable[[], None] | None:
    """A ``preexec_fn`` asking Linux to SIGKILL the child when ``parent`` dies (``prctl``).

    ``preexec_fn`` runs in the child between fork and exec, and the Python docs warn it is
    not safe with threads (the heartbeat's): a lock another thread held at the fork stays
    held in the child. So everything is resolved here, in the parent, and the function
    only calls ``prctl`` (a system call through ctypes, no import, no Python lock) and
    ``getppid``. The kernel sends the signal when the *thread* that forked exits: spawn
    from the main thread, which lives as long as the process. None where there is no
    ``prctl`` (not Linux): there, a SIGKILLed ``runlocked`` leaves its child running.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    kill, getppid, exit_now = int(signal.SIGKILL), os.getppid, os._exit

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, kill, 0, 0, 0)
        if getppid() != parent:  # the parent died before the request took effect
            exit_now(1)

    return preexec


def management_argv(name: str, args: list[str]) -> list[str]:
    """How to run ``manage.py NAME ARGS`` again in a child: the script that started us
    (manage.py or django-admin) when there is one, else ``python -m django``."""
    script = sys.argv[0] if sys.argv else ""
    if os.path.isfile(script) and "runlocked" in sys.argv[1:]:
        return [sys.executable, script, name, *args]
    return [sys.executable, "-m", "django", name, *args]


def signal_group(child: subprocess.Popen[bytes], signum: int) -> None:
    """Signal the child's process group (its own session): its own children too."""
    try:
        os.killpg(child.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


@contextmanager
def stop_signals(on_signal: Callable[[int], None]) -> Iterator[None]:
    """SIGTERM and SIGINT call ``on_signal`` instead of ending the process (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    for signum in previous:
        signal.signal(signum, lambda signum, frame: on_signal(signum))
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


class Standby:
    """The loop of one ``runlocked --standby``: campaign, run the child while leading, stop
    it before the term ends, campaign again."""

    def __init__(
        self,
        command: BaseCommand,
        election: Election,
        argv: list[str],
        *,
        name: str,
        grace: float,
        env: dict[str, str],
        verbosity: int,
    ):
        self.command = command
        self.election = election
        self.argv = argv
        self.name = name
        self.grace = grace
        self.stop_at = grace + STOP_SLACK
        self.env = env
        self.verbosity = verbosity
        self.signum: int | None = None
        self.warned: Lease | None = None  # the last term found too short to start the command in
        self.wake = threading.Event()
        election.on_lost(lambda term, reason: self.wake.set())

    def on_signal(self, signum: int) -> None:
        self.signum = signum
        self.wake.set()

    def say(self, message: str) -> None:
        logger.info("%s", message)
        if self.verbosity >= 1:
            self.command.stderr.write(message)

    def run(self) -> int:
        """Until asked to stop, or until the child exits by itself while leading: its exit status."""
        try:
            while self.signum is None:
                term = self.campaign()
                if term is None:
                    continue
                if self.signum is not None:
                    break  # asked to stop while the campaign's last look was under way
                if term.remaining() <= self.stop_at:
                    # A term at risk (renewals failing): wait until one gets through, or it ends.
                    self.too_short(term)
                    self.pause()
                    continue
                outcome, code = self.lead(term)
                if outcome is Outcome.EXITED:
                    self.say(
                        _("%(command)s ended by itself (%(status)s): resigning leadership of %(key)r.")
                        % {"command": self.name, "status": describe_status(code), "key": self.election.name}
                    )
                    return exit_status(code)
        finally:
            with translated_errors():
                self.election.resign()
        return 0

    def too_short(self, term: Lease) -> None:
        if term is not self.warned:
            self.warned = term
            logger.warning(
                "election %r: term %s has %.1fs of validity left, no more than --grace + %gs: "
                "waiting for a renewal before running %s",
                self.election.name,
                term.token,
                term.remaining(),
                STOP_SLACK,
                self.name,
            )

    def pause(self) -> None:
        self.wake.wait(TICK)
        self.wake.clear()

    def campaign(self) -> Lease | None:
        with translated_errors():
            try:
                return self.election.campaign(wait=CAMPAIGN_CHUNK)
            except LockNotAcquired:
                return None

    def spawn(self, term: Lease) -> subprocess.Popen[bytes]:
        env = {**self.env, ELECTION_ENV: self.election.name, TOKEN_ENV: str(term.token)}
        return subprocess.Popen(
            self.argv,
            env=env,
            start_new_session=True,  # a group of its own: signalled as one, and spared a terminal's Ctrl-C
            preexec_fn=parent_death_signal(os.getpid()),  # noqa: PLW1509 (see parent_death_signal)
        )

    def lead(self, term: Lease) -> tuple[Outcome, int]:
        try:
            child = self.spawn(term)
        except OSError as exc:
            usage_error(_("cannot run %(command)s: %(error)s") % {"command": self.name, "error": exc})
        self.say(
            _("Elected leader of %(key)r (term %(token)s): running %(command)s (pid %(pid)s).")
            % {"key": self.election.name, "token": term.token, "command": self.name, "pid": child.pid}
        )
        try:
            while True:
                code = child.poll()
                if code is not None:
                    signal_group(child, signal.SIGKILL)  # anything it left in its group
                    return Outcome.EXITED, code
                if self.signum is not None:
                    outcome = Outcome.ASKED
                elif not term.is_held:
                    outcome = Outcome.LOST
                elif term.remaining() <= self.stop_at:
                    outcome = Outcome.AT_RISK
                else:
                    self.pause()
                    continue
                return outcome, self.stop(child, term, outcome)
        except BaseException:
            # Whatever went wrong here, the child must not outlive our watch over it.
            signal_group(child, signal.SIGKILL)
            child.wait()
            raise

    def stop(self, child: subprocess.Popen[bytes], term: Lease, outcome: Outcome) -> int:
        """SIGTERM, then SIGKILL after ``grace`` or ``STOP_SLACK`` before the validity ends."""
        left = term.remaining()
        if outcome is Outcome.ASKED:
            reason = _("%(signal)s received") % {"signal": signal.Signals(self.signum or signal.SIGTERM).name}
        elif outcome is Outcome.AT_RISK:
            reason = _("no renewal got through, %(left).1fs of the term left") % {"left": left}
        else:
            reason = _("the term was lost (%(reason)s)") % {"reason": term.lost_reason or "expired"}
        self.say(
            _("Stopping %(command)s (pid %(pid)s), leader of %(key)r: %(reason)s.")
            % {"command": self.name, "pid": child.pid, "key": self.election.name, "reason": reason}
        )
        patience = max(0.0, min(self.grace, left - STOP_SLACK)) if term.is_held else 0.0
        if patience > 0:
            signal_group(child, signal.SIGTERM)
            try:
                code = child.wait(timeout=patience)
            except subprocess.TimeoutExpired:
                code = None
        else:
            code = None
        if code is None:
            signal_group(child, signal.SIGKILL)
            code = self.reap(child)
        signal_group(child, signal.SIGKILL)  # anything it left in its group
        self.say(_("%(command)s stopped (%(status)s).") % {"command": self.name, "status": describe_status(code)})
        return code

    def reap(self, child: subprocess.Popen[bytes]) -> int:
        # Not given up on: a child in uninterruptible sleep dies once its I/O ends, and no
        # new term may start before it has.
        while True:
            try:
                return child.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                logger.error("%s (pid %s) survives SIGKILL; still waiting for it", self.name, child.pid)


def run_standby(
    command: BaseCommand,
    *,
    key: str,
    command_line: list[str],
    run_program: bool,
    lease: float | None,
    grace: float | None,
    using: str,
    verbosity: int,
) -> int:
    """``runlocked --standby``: the exit status to end with (docs/commands/runlocked.md)."""
    client = lock_client(using)
    lease_seconds = client.options.lease_duration if lease is None else lease
    most = longest_grace(client, lease_seconds)
    if most < MIN_GRACE:
        usage_error(
            _(
                "a %(lease)gs lease is too short for --standby: the command must be stopped before "
                "the term ends, yet a healthy term may have only %(floor).1fs left before its next renewal; "
                "use a longer --lease"
            )
            % {"lease": lease_seconds, "floor": most + STOP_SLACK}
        )
    if grace is None:
        grace = min(DEFAULT_GRACE, most)
    elif grace > most:
        usage_error(
            _(
                "--grace %(grace)gs does not fit in the %(lease)gs lease: the command is sent SIGTERM when "
                "renewals fail and the term has grace + %(slack)gs left, and a healthy term may have only "
                "%(floor).1fs left before its next renewal; use --grace %(most).1f or less, or a longer --lease"
            )
            % {
                "grace": grace,
                "lease": lease_seconds,
                "slack": STOP_SLACK,
                "floor": most + STOP_SLACK,
                "most": most,
            }
        )
    name = command_line[0]
    env = dict(os.environ)
    if run_program:
        if shutil.which(name) is None:
            usage_error(_("--exec: no program %(program)r to run (not found, or not executable)") % {"program": name})
        argv = command_line
        name = os.path.basename(name)
    else:
        argv = management_argv(name, command_line[1:])
        # The settings and import path this process runs with, --settings and --pythonpath included.
        if settings.SETTINGS_MODULE:
            env["DJANGO_SETTINGS_MODULE"] = settings.SETTINGS_MODULE
        env["PYTHONPATH"] = os.pathsep.join(path for path in sys.path if path and os.path.isdir(path))
    with translated_errors():
        election = client.election(key, lease=lease, holder={"command": name})
    standby = Standby(command, election, argv, name=name, grace=grace, env=env, verbosity=verbosity)
    with stop_signals(standby.on_signal):
        return standby.run()
