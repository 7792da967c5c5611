"""``manage.py createlocktable``: create the lock table of an alias, idempotently."""

from __future__ import annotations

import time
from typing import Any

from django.core.management.base import CommandError, CommandParser

from ...engine.client import LockClient
from ...engine.failures import safe_endpoint
from ...engine.table import TTL_UNSUPPORTED, TableStatus, table_definition
from ...exceptions import TableNotFound
from .. import tabledef
from ..base import EXIT_BACKEND, DynLockCommand, positive_int, positive_seconds, translated_errors, usage_error

POLL_INTERVAL = 0.5  # seconds between DescribeTable calls while waiting for ACTIVE
PROGRESS_EVERY = 5.0  # seconds between progress lines when the status does not change
PRINT_CHOICES = ("all", "create-table", "ttl", "cloudformation")


def ttl_is_on(status: TableStatus, attribute: str) -> bool:
    return status.ttl_status in ("ENABLED", "ENABLING") and status.ttl_attribute == attribute


class Command(DynLockCommand):
    help = (
        "Create the DynamoDB lock table of a DYNLOCK alias and enable TTL on it. Idempotent: an "
        "existing table with the right key schema is accepted (and gets TTL if it had none)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        super().add_arguments(parser)
        parser.add_argument(
            "--billing-mode",
            type=str.upper,
            choices=("PAY_PER_REQUEST", "PROVISIONED"),
            default=None,
            help="Billing of a new table. Default: PAY_PER_REQUEST (on-demand).",
        )
        parser.add_argument("--read", type=positive_int, metavar="N", help="Read capacity units (PROVISIONED only).")
        parser.add_argument("--write", type=positive_int, metavar="N", help="Write capacity units (PROVISIONED only).")
        parser.add_argument(
            "--no-wait",
            dest="wait",
            action="store_false",
            help="Return as soon as the table is requested; do not wait until it is ACTIVE.",
        )
        parser.add_argument(
            "--timeout",
            type=positive_seconds,
            default=60.0,
            metavar="SECONDS",
            help="Seconds to wait for the table to become ACTIVE. Default: %(default)s.",
        )
        parser.add_argument(
            "--print",
            nargs="?",
            const="all",
            choices=PRINT_CHOICES,
            dest="print_only",
            metavar="WHAT",
            help="Print the CreateTable and UpdateTimeToLive requests and a CloudFormation snippet "
            f"instead of calling AWS. WHAT: {', '.join(PRINT_CHOICES)} (default: all).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        self.verbosity = options["verbosity"]
        explicit_billing = options["billing_mode"] is not None
        billing = options["billing_mode"] or "PAY_PER_REQUEST"
        read, write = options["read"], options["write"]
        if billing == "PROVISIONED" and (read is None or write is None):
            usage_error("--billing-mode PROVISIONED needs --read N and --write N")
        if billing != "PROVISIONED" and (read is not None or write is not None):
            usage_error("--read and --write only apply with --billing-mode PROVISIONED")
        client = self.client(options)
        if options["print_only"]:
            self.print_definition(client, options["print_only"], billing, read, write)
            return
        with translated_errors():
            self.create(
                client,
                billing,
                read,
                write,
                wait=options["wait"],
                timeout=options["timeout"],
                explicit_billing=explicit_billing,
            )

    # -- output -------------------------------------------------------------------
    def info(self, message: str, style: Any = None) -> None:
        if self.verbosity >= 1:
            self.stdout.write(message, style_func=style)

    def warn(self, message: str) -> None:
        self.stderr.write(f"Warning: {message}", style_func=self.style.WARNING)

    # -- --print --------------------------------------------------------------------
    def print_definition(
        self, client: LockClient, what: str, billing: str, read: int | None, write: int | None
    ) -> None:
        options = client.options
        create = tabledef.as_json(
            table_definition(options, billing_mode=billing, read_capacity=read, write_capacity=write)
        )
        ttl = tabledef.as_json(tabledef.ttl_request(options))
        stack = tabledef.cloudformation(options, billing, read, write)
        if what == "create-table":
            self.stdout.write(create)
        elif what == "ttl":
            self.stdout.write(ttl)
        elif what == "cloudformation":
            self.stdout.write(stack)
        else:
            self.stdout.write(
                "# CreateTable request: aws dynamodb create-table --cli-input-json file://create-table.json"
            )
            self.stdout.write(create)
            self.stdout.write("")
            self.stdout.write(
                "# Then, once the table is ACTIVE: aws dynamodb update-time-to-live --cli-input-json file://ttl.json"
            )
            self.stdout.write(ttl)
            self.stdout.write("")
            self.stdout.write("# CloudFormation (YAML); TimeToLiveSpecification replaces the separate TTL request")
            self.stdout.write(stack)

    # -- creating -------------------------------------------------------------------
    def create(
        self,
        client: LockClient,
        billing: str,
        read: int | None,
        write: int | None,
        *,
        wait: bool,
        timeout: float,
        explicit_billing: bool,
    ) -> None:
        options = client.options
        name, where = options.table_name, client.where()
        try:
            before: TableStatus | None = client.describe_table()
        except TableNotFound:
            before = None
        if before is not None and before.key_problem:
            raise CommandError(
                f"table {name!r} at {where} exists but has the wrong key schema: {before.key_problem}. "
                f"Point TABLE_NAME at a new table, or set KEY_ATTRIBUTE to the table's partition key.",
                returncode=EXIT_BACKEND,
            )
        if before is None:
            capacity = f" (read {read}, write {write})" if billing == "PROVISIONED" else ""
            self.info(
                f"Creating table {name!r} at {where}: partition key {options.key_attribute!r} (string), "
                f"{billing}{capacity} ..."
            )
            status = client.create_table(
                wait=False, billing_mode=billing, read_capacity=read, write_capacity=write, timeout=timeout
            )
        else:
            status = before
            self.info(
                f"Table {name!r} already exists at {where} with the right key schema "
                f"({status.status}, {status.billing_mode})."
            )
            if explicit_billing and status.billing_mode != billing:
                self.warn(f"--billing-mode {billing} was not applied: the existing table stays {status.billing_mode}.")

        if status.status != "ACTIVE" and not wait:
            self.info(
                f"Not waiting (--no-wait): table {name!r} is {status.status}. TTL is enabled once it is "
                f"ACTIVE: run createlocktable again then."
            )
            return
        if status.status != "ACTIVE" or before is None:
            status = self.wait_until_active(client, status, timeout)

        if before is not None and ttl_is_on(before, options.ttl_attribute):
            self.info(f"TTL already enabled on {options.ttl_attribute!r}.")
            return
        if not ttl_is_on(status, options.ttl_attribute):
            # create_table() is idempotent: on an existing table it only switches TTL on.
            status = client.create_table(
                wait=True, billing_mode=billing, read_capacity=read, write_capacity=write, timeout=timeout
            )
        self.report_ttl(client, status)

    def wait_until_active(self, client: LockClient, status: TableStatus, timeout: float) -> TableStatus:
        started = time.monotonic()
        deadline = started + timeout
        said_at, said = started, ""
        while status.status != "ACTIVE":
            now = time.monotonic()
            if now >= deadline:
                raise CommandError(
                    f"table {status.name!r} is still {status.status} after {timeout:g}s: run createlocktable "
                    f"again later (it also enables TTL then)",
                    returncode=EXIT_BACKEND,
                )
            if status.status != said or now - said_at >= PROGRESS_EVERY:
                self.info(f"  waiting for ACTIVE: {status.status} after {now - started:.1f}s")
                said_at, said = now, status.status
            time.sleep(min(POLL_INTERVAL, max(0.0, deadline - now)))
            status = client.describe_table()
        self.info(f"Table {status.name!r} is ACTIVE after {time.monotonic() - started:.1f}s.", self.style.SUCCESS)
        return status

    def report_ttl(self, client: LockClient, status: TableStatus) -> None:
        options = client.options
        if status.ttl_status == TTL_UNSUPPORTED:
            self.warn(
                f"the DynamoDB server at {safe_endpoint(options.endpoint_url)} has no TTL API (a local "
                f"server such as dynalite?): TTL is not enabled, so idle lock items are not deleted "
                f"automatically. The locks work all the same."
            )
        elif status.ttl_attribute not in (None, options.ttl_attribute):
            self.warn(
                f"table {status.name!r} has TTL on {status.ttl_attribute!r}, not on "
                f"{options.ttl_attribute!r} (a table has one TTL attribute): idle lock items will not "
                f"expire. Set TTL_ATTRIBUTE to {status.ttl_attribute!r}, or change the table's TTL."
            )
        elif status.ttl_status in ("ENABLED", "ENABLING"):
            self.info(f"TTL enabled on {options.ttl_attribute!r} ({status.ttl_status}).", self.style.SUCCESS)
        else:
            self.warn(f"TTL on table {status.name!r} is {status.ttl_status}: run createlocktable again later.")
