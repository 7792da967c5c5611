"""``manage.py showlocks``: list the leases in the lock table, page by page."""

from __future__ import annotations

import itertools
from time import sleep
from typing import Any

from django.core.management.base import CommandParser
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from ...engine.client import LockClient
from .. import listing
from ..base import DynLockCommand, positive_int, positive_seconds, translated_errors, usage_error

FORMATS = ("table", "json", "csv")
CLEAR_SCREEN = "\x1b[H\x1b[2J"
# The key showlocks reads once to learn whether the table is keyed on KEY_ATTRIBUTE.
SCHEMA_PROBE_KEY = "showlocks:key-schema"


class _Raw:
    """File-like view of an OutputWrapper that adds no line endings: the writers add their own."""

    def __init__(self, wrapper: Any) -> None:
        self.wrapper = wrapper

    def write(self, text: str) -> None:
        self.wrapper.write(text, ending="")


class Command(DynLockCommand):
    help = gettext_lazy(
        "List live leases: key, holder, token, when acquired, when they expire and the holder's metadata. "
        "Streams the table page by page."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument(
            "--format",
            choices=FORMATS,
            default="table",
            help=_("Output format. Default: %(default)s. json is one array; csv has a header row."),
        )
        parser.add_argument("--prefix", default="", help=_("Only keys starting with this (after KEY_PREFIX)."))
        parser.add_argument(
            "--all",
            action="store_true",
            dest="show_all",
            help=_("Also list released, broken and expired leases, with a STATE column."),
        )
        parser.add_argument(
            "--watch",
            type=positive_seconds,
            metavar="SECONDS",
            help=_("Refresh every SECONDS until interrupted (Ctrl-C)."),
        )
        parser.add_argument(
            "--iterations", type=positive_int, metavar="N", help=_("With --watch: stop after N refreshes.")
        )
        parser.add_argument(
            "--page-size",
            type=positive_int,
            default=100,
            metavar="N",
            help=_("Items per Scan request. Default: %(default)s."),
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["iterations"] is not None and options["watch"] is None:
            usage_error(_("--iterations only applies with --watch SECONDS"))
        client = self.client(options)
        self.check_key_schema(client)
        if options["watch"] is None:
            self.show(client, options)
            return
        try:
            self.watch(client, options)
        except KeyboardInterrupt:
            # Ctrl-C is how --watch is meant to end: no traceback, exit 0.
            self.stdout.write("")

    def check_key_schema(self, client: LockClient) -> None:
        """A table keyed on another attribute holds none of our leases: its Scan would
        say "No live leases". One read of a key (GetItem, a runtime action, unlike
        DescribeTable) raises TableSchemaError there (dynlock.E103)."""
        with translated_errors():
            client.get(SCHEMA_PROBE_KEY)

    def watch(self, client: LockClient, options: dict[str, Any]) -> None:
        interval, limit = options["watch"], options["iterations"]
        refresh = 0
        while limit is None or refresh < limit:
            refresh += 1
            if refresh > 1:
                sleep(interval)
            if options["format"] == "table":
                # Machine formats get one clean document per refresh; people get a heading.
                if self.stdout.isatty():
                    self.stdout.write(CLEAR_SCREEN, ending="")
                stamp = client.server_datetime().strftime("%Y-%m-%d %H:%M:%S UTC")
                self.stdout.write(
                    _("Every %(interval)ss: %(command)s   %(stamp)s")
                    % {"interval": f"{interval:g}", "command": f"showlocks --alias {options['alias']}", "stamp": stamp},
                    style_func=self.style.MIGRATE_HEADING,
                )
            self.show(client, options)

    def show(self, client: LockClient, options: dict[str, Any]) -> None:
        show_all = options["show_all"]
        counts = listing.Counts()
        out = _Raw(self.stdout)
        with translated_errors():
            leases = client.leases(options["prefix"], include_released=show_all, page_size=options["page_size"])
            first = next(leases, None)
            # Lease times are DynamoDB's clock, which the first page's reply told us.
            now = client.server_datetime()
            infos = listing.visible(
                itertools.chain([first] if first is not None else [], leases), now, show_all, counts
            )
            if options["format"] == "json":
                listing.write_json(infos, now, out)
            elif options["format"] == "csv":
                listing.write_csv(infos, now, out)
            else:
                listing.write_table(
                    listing.grouped(infos, client.semaphore_limit),
                    now,
                    out,
                    show_state=show_all,
                    header_style=self.style.SQL_FIELD,
                )
        if options["format"] == "table" and options["verbosity"] >= 1:
            self.summarise(client, counts, options)

    def summarise(self, client: LockClient, counts: listing.Counts, options: dict[str, Any]) -> None:
        values = {
            "count": counts.written,
            "table": client.options.table_name,
            "where": client.where(),
            "prefix": options["prefix"],
        }
        # Which table, and where: each region has tables of its own (docs/security.md).
        if not counts.written:
            if options["show_all"]:
                line = (
                    _("No leases with prefix %(prefix)r in table %(table)r at %(where)s.")
                    if options["prefix"]
                    else _("No leases in table %(table)r at %(where)s.")
                ) % values
            else:
                line = (
                    _("No live leases with prefix %(prefix)r in table %(table)r at %(where)s.")
                    if options["prefix"]
                    else _("No live leases in table %(table)r at %(where)s.")
                ) % values
        elif options["prefix"]:
            line = (
                ngettext(
                    "%(count)d lease with prefix %(prefix)r in table %(table)r at %(where)s.",
                    "%(count)d leases with prefix %(prefix)r in table %(table)r at %(where)s.",
                    counts.written,
                )
                if options["show_all"]
                else ngettext(
                    "%(count)d live lease with prefix %(prefix)r in table %(table)r at %(where)s.",
                    "%(count)d live leases with prefix %(prefix)r in table %(table)r at %(where)s.",
                    counts.written,
                )
            ) % values
        else:
            line = (
                ngettext(
                    "%(count)d lease in table %(table)r at %(where)s.",
                    "%(count)d leases in table %(table)r at %(where)s.",
                    counts.written,
                )
                if options["show_all"]
                else ngettext(
                    "%(count)d live lease in table %(table)r at %(where)s.",
                    "%(count)d live leases in table %(table)r at %(where)s.",
                    counts.written,
                )
            ) % values
        self.stdout.write(line)
        if counts.hidden_expired:
            self.stdout.write(
                ngettext(
                    "(%(count)d expired lease not shown: the holder stopped renewing. "
                    "The next acquire takes it over; --all shows them.)",
                    "(%(count)d expired leases not shown: the holder stopped renewing. "
                    "The next acquire takes it over; --all shows them.)",
                    counts.hidden_expired,
                )
                % {"count": counts.hidden_expired},
                style_func=self.style.WARNING,
            )
        if counts.hidden_kept:
            self.stdout.write(
                ngettext(
                    "(%(count)d expired lease not shown: runlocked --at-least kept it after its run, as "
                    "asked. The next acquire takes it over; --all shows them.)",
                    "(%(count)d expired leases not shown: runlocked --at-least kept them after their runs, "
                    "as asked. The next acquire takes them over; --all shows them.)",
                    counts.hidden_kept,
                )
                % {"count": counts.hidden_kept}
            )
