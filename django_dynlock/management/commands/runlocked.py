"""``manage.py runlocked KEY -- COMMAND [ARGS...]``: run a command under a lease.

For cron jobs scheduled on many hosts: one host runs the command, the others find
the key busy and skip (exit 0, or ``--busy-exit``). The inner command's exit code is
passed through. Shares its implementation with ``@singleton_command``.

With ``--standby`` (and ``--exec`` for a program), a daemon run on every host: the
hosts elect a leader, which runs the command while it leads (django_dynlock/standby.py).
"""

from __future__ import annotations

import sys
from typing import Any

from django.core.management import call_command, get_commands, load_command_class
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from ...engine.lease import Lease
from ...singleton import run_singleton
from ...standby import run_standby
from ..base import DynLockCommand, exit_code, positive_seconds, seconds, semaphore_limit, usage_error

SEPARATOR = "--"


def split_command_line(args: list[str]) -> tuple[list[str], list[str] | None]:
    """Our arguments, and the inner command line after the first ``--`` (None without one).

    Done before argparse, which handles ``--`` between a positional and REMAINDER
    inconsistently (``runlocked KEY --wait 5 -- cmd`` would fail).
    """
    if SEPARATOR not in args:
        return args, None
    at = args.index(SEPARATOR)
    return args[:at], args[at + 1 :]


def load_command(name: str) -> BaseCommand:
    """The inner command, resolved like call_command (first installed app defining it)."""
    try:
        app_name = get_commands()[name]
    except KeyError:
        usage_error(_("unknown command %(name)r after --: see `manage.py help` for the commands") % {"name": name})
    if isinstance(app_name, BaseCommand):
        return app_name
    return load_command_class(app_name, name)


class Command(DynLockCommand):
    help = gettext_lazy(
        "Run another management command under a lease (KEY), renewing it while the command runs. "
        "Busy: skip with a message (exit 0, or --busy-exit). The command's exit code is passed through."
    )
    missing_args_message = "usage: runlocked KEY -- COMMAND [ARGS ...]"

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        kwargs.setdefault("usage", f"%(prog)s [options] KEY {SEPARATOR} COMMAND [ARGS ...]")
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        parse = parser.parse_args

        def parse_args(args: Any = None, namespace: Any = None) -> Any:
            ours, inner = split_command_line(list(sys.argv[1:] if args is None else args))
            parsed = parse(ours, namespace)
            if inner is not None:
                if parsed.command:
                    parser.error(
                        _("give the command after %(separator)s only, not also before it: %(command)s")
                        % {"separator": SEPARATOR, "command": parsed.command}
                    )
                parsed.command = inner
            return parsed

        parser.parse_args = parse_args
        return parser

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("key", metavar="KEY", help=_("Lock key, e.g. cron:clearsessions."))
        parser.add_argument(
            "command",
            nargs="*",
            metavar="COMMAND",
            help=_("The management command to run and its arguments, after --."),
        )
        parser.add_argument(
            "--wait",
            type=seconds,
            default=None,
            metavar="SECONDS",
            help=_("Seconds to wait for a busy lock before skipping. Default: 0."),
        )
        parser.add_argument(
            "--lease",
            type=positive_seconds,
            default=None,
            metavar="SECONDS",
            help=_("Lease duration in seconds (renewed while the command runs). Default: the alias' LEASE_DURATION."),
        )
        parser.add_argument(
            "--at-least",
            type=seconds,
            default=None,
            dest="at_least",
            metavar="SECONDS",
            help=_(
                "Keep the lock until SECONDS after it was taken, even if the command "
                "finished sooner, so other hosts' runs of the same schedule skip."
            ),
        )
        parser.add_argument(
            "--busy-exit",
            type=exit_code,
            default=None,
            dest="busy_exit",
            metavar="CODE",
            help=_("Exit code when the lock is busy. Default: 0 (skipping is not a failure)."),
        )
        parser.add_argument(
            "--limit",
            type=semaphore_limit,
            default=None,
            metavar="N",
            help=_(
                "Let N runs hold KEY at once, as consul lock -n does (a semaphore; the same N on every host). "
                "Default: 1."
            ),
        )
        parser.add_argument(
            "--standby",
            action="store_true",
            help=_(
                "Campaign in the election KEY without limit and run the command while leading; stop it "
                "before the term ends if leadership is lost, then campaign again."
            ),
        )
        parser.add_argument(
            "--exec",
            action="store_true",
            dest="exec",
            help=_("With --standby: the command is a program (e.g. celery -A proj beat), not a management command."),
        )
        parser.add_argument(
            "--grace",
            type=positive_seconds,
            default=None,
            metavar="SECONDS",
            help=_(
                "With --standby: seconds between SIGTERM and SIGKILL when the command must stop. "
                "Default: 10, or the most the lease leaves room for."
            ),
        )

    def handle(self, *args: Any, **options: Any) -> None:
        command_line: list[str] = list(options["command"] or [])
        self.check_modes(options)
        if not command_line:
            usage_error(_("no command to run: %(usage)s") % {"usage": f"runlocked KEY {SEPARATOR} COMMAND [ARGS ...]"})
        name, inner_args = command_line[0], command_line[1:]
        if not options["exec"]:
            inner = load_command(name)
            self.check_arguments(inner, name, inner_args)
        if options["standby"]:
            status = run_standby(
                self,
                key=options["key"],
                command_line=command_line,
                run_program=options["exec"],
                lease=options["lease"],
                grace=options["grace"],
                using=options["alias"],
                verbosity=options["verbosity"],
            )
            if status:
                raise SystemExit(status)
            return
        out = getattr(self.stdout, "_out", self.stdout)
        err = getattr(self.stderr, "_out", self.stderr)

        def body(lease: Lease) -> None:
            inner.dynlock_lease = lease
            call_command(inner, *inner_args, stdout=out, stderr=err)

        run_singleton(
            body,
            key=options["key"],
            holder={"command": name},
            command=self,
            wait=options["wait"] or 0.0,
            lease=options["lease"],
            at_least=options["at_least"] or 0.0,
            busy_exit=options["busy_exit"] or 0,
            using=options["alias"],
            verbosity=options["verbosity"],
            limit=options["limit"] or 1,
        )

    def check_modes(self, options: dict[str, Any]) -> None:
        """Refuse options that do not go together, before anything else."""
        if not options["standby"]:
            extra = [flag for flag, dest in (("--exec", "exec"), ("--grace", "grace")) if options[dest]]
            if extra:
                usage_error(_("only with --standby: %(options)s") % {"options": ", ".join(extra)})
            return
        # A standby waits without limit and runs for as long as it leads: one-shot options mean nothing.
        one_shot = [
            flag
            for flag, dest in (
                ("--wait", "wait"),
                ("--busy-exit", "busy_exit"),
                ("--at-least", "at_least"),
                ("--limit", "limit"),
            )
            if options[dest] is not None
        ]
        if one_shot:
            usage_error(
                _(
                    "%(options)s cannot be used with --standby: a standby waits without limit for its turn "
                    "and runs the command for as long as it leads"
                )
                % {"options": ", ".join(one_shot)}
            )

    def check_arguments(self, inner: BaseCommand, name: str, inner_args: list[str]) -> None:
        """Refuse bad inner arguments before taking the lock, not after."""
        try:
            inner.create_parser("", name).parse_args(inner_args)
        except CommandError as exc:
            usage_error(f"{name}: {exc}")
