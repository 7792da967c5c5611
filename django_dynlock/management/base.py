"""What the dynlock management commands share: ``--alias``, exit codes, error mapping.

Every command turns the library's errors into a one-line ``CommandError`` with a
documented exit code, so ``manage.py`` never shows a traceback for an unreachable
endpoint, a missing table or bad credentials, and scripts can tell a usage mistake
(fix the command line or settings) from a DynamoDB problem (fix the environment).
"""

from __future__ import annotations

import argparse
import contextlib
import math
from collections.abc import Iterator
from typing import Any, NoReturn

from botocore.exceptions import BotoCoreError, ClientError
from django.core.management.base import BaseCommand, CommandError, CommandParser, SystemCheckError
from django.utils.translation import gettext as _

from .. import conf
from ..engine.client import LockClient
from ..engine.keys import MAX_LIMIT
from ..exceptions import ConfigurationError, DynLockError, InvalidArgument, InvalidKey
from ..registry import get_lock_client

#: Bad arguments or settings: the command line or DYNLOCK needs fixing.
EXIT_USAGE = 2
#: DynamoDB could not be used: unreachable, table missing, credentials, access denied...
EXIT_BACKEND = 3


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def command_error(exc: BaseException) -> CommandError:
    """The CommandError (message and exit code) for an error of the library or botocore."""
    usage = isinstance(exc, (ConfigurationError, InvalidArgument, InvalidKey))
    return CommandError(one_line(str(exc)), returncode=EXIT_USAGE if usage else EXIT_BACKEND)


@contextlib.contextmanager
def translated_errors() -> Iterator[None]:
    """Run library calls so that their failures become one-line CommandErrors."""
    try:
        yield
    except (DynLockError, BotoCoreError, ClientError) as exc:
        raise command_error(exc) from exc


def usage_error(message: str) -> NoReturn:
    raise CommandError(message, returncode=EXIT_USAGE)


def lock_client(alias: str) -> LockClient:
    """The alias' client; an unknown or misconfigured alias is a usage error."""
    configured = conf.aliases()
    if alias not in configured:
        names = ", ".join(repr(name) for name in configured) or _("none")
        usage_error(_("unknown alias %(alias)r: DYNLOCK defines %(names)s") % {"alias": alias, "names": names})
    with translated_errors():
        return get_lock_client(alias)


def seconds(text: str) -> float:
    """argparse type: a finite, non-negative number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(_("expected a number of seconds, got %(text)r") % {"text": text}) from None
    if math.isnan(value) or math.isinf(value) or value < 0:
        raise argparse.ArgumentTypeError(_("expected a finite number of seconds >= 0, got %(text)r") % {"text": text})
    return value


def positive_seconds(text: str) -> float:
    value = seconds(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(_("expected a number of seconds > 0, got %(text)r") % {"text": text})
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(_("expected a whole number, got %(text)r") % {"text": text}) from None
    if value < 1:
        raise argparse.ArgumentTypeError(_("expected a whole number >= 1, got %(text)r") % {"text": text})
    return value


def semaphore_limit(text: str) -> int:
    """argparse type: a semaphore's limit, 1-99 (what one BatchGetItem can read)."""
    value = positive_int(text)
    if value > MAX_LIMIT:
        raise argparse.ArgumentTypeError(
            _("expected a limit of 1-%(most)s, got %(text)r") % {"most": MAX_LIMIT, "text": text}
        )
    return value


def exit_code(text: str) -> int:
    """argparse type: a process exit status, 0-255."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(_("expected an exit code 0-255, got %(text)r") % {"text": text}) from None
    if not 0 <= value <= 255:
        raise argparse.ArgumentTypeError(_("expected an exit code 0-255, got %(text)r") % {"text": text})
    return value


class DynLockCommand(BaseCommand):
    """Base of the dynlock commands: ``--alias`` and consistent exit codes."""

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        # help is translated lazily (gettext_lazy, read in the language of the run), and
        # argparse's formatter runs regular expressions over it: it needs a str.
        if parser.description is not None:
            parser.description = str(parser.description)
        cli_error = parser.error

        # From the shell argparse exits with 2; through call_command Django raises a
        # CommandError with returncode 1, which breaklock uses for "not all broken".
        # Keep bad arguments at EXIT_USAGE both ways.
        def error(message: str) -> NoReturn:
            if parser.called_from_command_line:
                cli_error(message)
            raise CommandError(_("Error: %(message)s") % {"message": message}, returncode=EXIT_USAGE)

        parser.error = error
        return parser

    def check(self, *args: Any, **kwargs: Any) -> None:
        # Django runs the system checks before the command and exits 1 when they fail;
        # for these commands a setting to fix is EXIT_USAGE, and 1 means something else
        # (breaklock: not every lock was broken).
        try:
            super().check(*args, **kwargs)
        except SystemCheckError as exc:
            exc.returncode = EXIT_USAGE
            raise

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--alias",
            default=conf.DEFAULT_ALIAS,
            help=_("The DYNLOCK alias (table and connection) to use. Default: %(default)s."),
        )

    def client(self, options: dict[str, Any]) -> LockClient:
        return lock_client(options["alias"])
