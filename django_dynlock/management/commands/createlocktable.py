"""``manage.py createlocktable``: create the lock table of an alias, idempotently."""

from __future__ import annotations

import re
import time
from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from ...engine import iam
from ...engine.client import LockClient
from ...engine.failures import safe_endpoint
from ...engine.table import TTL_UNSUPPORTED, TableStatus, table_definition
from ...exceptions import TableNotFound
from .. import tabledef
from ..base import EXIT_BACKEND, DynLockCommand, positive_int, positive_seconds, translated_errors, usage_error

POLL_INTERVAL = 0.5  # seconds between DescribeTable calls while waiting for ACTIVE
PROGRESS_EVERY = 5.0  # seconds between progress lines when the status does not change
PRINT_CHOICES = ("all", "create-table", "ttl", "cloudformation", "iam-runtime", "iam-deploy")


def ttl_is_on(status: TableStatus, attribute: str) -> bool:
    return status.ttl_status in ("ENABLED", "ENABLING") and status.ttl_attribute == attribute


class Command(DynLockCommand):
    help = gettext_lazy(
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
            help=_("Billing of a new table. Default: PAY_PER_REQUEST (on-demand)."),
        )
        parser.add_argument("--read", type=positive_int, metavar="N", help=_("Read capacity units (PROVISIONED only)."))
        parser.add_argument(
            "--write", type=positive_int, metavar="N", help=_("Write capacity units (PROVISIONED only).")
        )
        parser.add_argument(
            "--no-wait",
            dest="wait",
            action="store_false",
            help=_("Return as soon as the table is requested; do not wait until it is ACTIVE."),
        )
        parser.add_argument(
            "--timeout",
            type=positive_seconds,
            default=60.0,
            metavar="SECONDS",
            help=_("Seconds to wait for the table to become ACTIVE. Default: %(default)s."),
        )
        parser.add_argument(
            "--print",
            nargs="?",
            const="all",
            choices=PRINT_CHOICES,
            dest="print_only",
            metavar="WHAT",
            help=_(
                "Print the CreateTable and UpdateTimeToLive requests and a CloudFormation snippet "
                "instead of calling AWS. WHAT: %(choices)s (default: all). iam-runtime and iam-deploy "
                "print the least-privilege IAM policies for the table."
            )
            % {"choices": ", ".join(PRINT_CHOICES)},
        )
        parser.add_argument(
            "--account-id",
            metavar="ID",
            help=_("With --print iam-*: the AWS account of the table's ARN. Default: * (any account)."),
        )

    def handle(self, *args: Any, **options: Any) -> None:
        self.verbosity = options["verbosity"]
        explicit_billing = options["billing_mode"] is not None
        billing = options["billing_mode"] or "PAY_PER_REQUEST"
        read, write = options["read"], options["write"]
        if billing == "PROVISIONED" and (read is None or write is None):
            usage_error(_("--billing-mode PROVISIONED needs --read N and --write N"))
        if billing != "PROVISIONED" and (read is not None or write is not None):
            usage_error(_("--read and --write only apply with --billing-mode PROVISIONED"))
        client = self.client(options)
        if options["account_id"] is not None and not (options["print_only"] or "").startswith("iam-"):
            usage_error(_("--account-id only applies with --print iam-runtime or --print iam-deploy"))
        if options["account_id"] is not None and not re.fullmatch(r"\d{12}", options["account_id"]):
            usage_error(_("--account-id must be 12 digits, got %(value)r") % {"value": options["account_id"]})
        if (options["print_only"] or "").startswith("iam-"):
            which = options["print_only"].removeprefix("iam-")
            opts = client.options
            self.stdout.write(iam.policy_json(which, opts.table_name, opts.region_name, options["account_id"]))
            return
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
        self.stderr.write(_("Warning: %(message)s") % {"message": message}, style_func=self.style.WARNING)

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
                "# "
                + _("CreateTable request: %(command)s")
                % {"command": "aws dynamodb create-table --cli-input-json file://create-table.json"}
            )
            self.stdout.write(create)
            self.stdout.write("")
            self.stdout.write(
                "# "
                + _("Then, once the table is ACTIVE: %(command)s")
                % {"command": "aws dynamodb update-time-to-live --cli-input-json file://ttl.json"}
            )
            self.stdout.write(ttl)
            self.stdout.write("")
            self.stdout.write(
                "# " + _("CloudFormation (YAML); TimeToLiveSpecification replaces the separate TTL request")
            )
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
                _(
                    "table %(name)r at %(where)s exists but has the wrong key schema: %(problem)s. "
                    "Point TABLE_NAME at a new table, or set KEY_ATTRIBUTE to the table's partition key."
                )
                % {"name": name, "where": where, "problem": before.key_problem},
                returncode=EXIT_BACKEND,
            )
        if before is None:
            values = {"name": name, "where": where, "key": options.key_attribute, "billing": billing}
            self.info(
                _(
                    "Creating table %(name)r at %(where)s: partition key %(key)r (string), "
                    "%(billing)s (read %(read)s, write %(write)s) ..."
                )
                % {**values, "read": read, "write": write}
                if billing == "PROVISIONED"
                else _("Creating table %(name)r at %(where)s: partition key %(key)r (string), %(billing)s ...") % values
            )
            status = client.create_table(
                wait=False, billing_mode=billing, read_capacity=read, write_capacity=write, timeout=timeout
            )
        else:
            status = before
            self.info(
                _("Table %(name)r already exists at %(where)s with the right key schema (%(status)s, %(billing)s).")
                % {"name": name, "where": where, "status": status.status, "billing": status.billing_mode}
            )
            if explicit_billing and status.billing_mode != billing:
                self.warn(
                    _("--billing-mode %(billing)s was not applied: the existing table stays %(current)s.")
                    % {"billing": billing, "current": status.billing_mode}
                )

        if status.status != "ACTIVE" and not wait:
            self.info(
                _(
                    "Not waiting (--no-wait): table %(name)r is %(status)s. TTL is enabled once it is "
                    "ACTIVE: run createlocktable again then."
                )
                % {"name": name, "status": status.status}
            )
            return
        if status.status != "ACTIVE" or before is None:
            status = self.wait_until_active(client, status, timeout)

        if before is not None and ttl_is_on(before, options.ttl_attribute):
            self.info(_("TTL already enabled on %(attribute)r.") % {"attribute": options.ttl_attribute})
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
                    _(
                        "table %(name)r is still %(status)s after %(timeout)ss: run createlocktable "
                        "again later (it also enables TTL then)"
                    )
                    % {"name": status.name, "status": status.status, "timeout": f"{timeout:g}"},
                    returncode=EXIT_BACKEND,
                )
            if status.status != said or now - said_at >= PROGRESS_EVERY:
                self.info(
                    "  "
                    + _("waiting for ACTIVE: %(status)s after %(elapsed)ss")
                    % {"status": status.status, "elapsed": f"{now - started:.1f}"}
                )
                said_at, said = now, status.status
            time.sleep(min(POLL_INTERVAL, max(0.0, deadline - now)))
            status = client.describe_table()
        self.info(
            _("Table %(name)r is ACTIVE after %(elapsed)ss.")
            % {"name": status.name, "elapsed": f"{time.monotonic() - started:.1f}"},
            self.style.SUCCESS,
        )
        return status

    def report_ttl(self, client: LockClient, status: TableStatus) -> None:
        options = client.options
        if status.ttl_status == TTL_UNSUPPORTED:
            self.warn(
                _(
                    "the DynamoDB server at %(endpoint)s has no TTL API (a local "
                    "server such as dynalite?): TTL is not enabled, so idle lock items are not deleted "
                    "automatically. The locks work all the same."
                )
                % {"endpoint": safe_endpoint(options.endpoint_url)}
            )
        elif status.ttl_attribute not in (None, options.ttl_attribute):
            self.warn(
                _(
                    "table %(name)r has TTL on %(attribute)r, not on "
                    "%(expected)r (a table has one TTL attribute): idle lock items will not "
                    "expire. Set TTL_ATTRIBUTE to %(attribute)r, or change the table's TTL."
                )
                % {"name": status.name, "attribute": status.ttl_attribute, "expected": options.ttl_attribute}
            )
        elif status.ttl_status in ("ENABLED", "ENABLING"):
            self.info(
                _("TTL enabled on %(attribute)r (%(status)s).")
                % {"attribute": options.ttl_attribute, "status": status.ttl_status},
                self.style.SUCCESS,
            )
        else:
            self.warn(
                _("TTL on table %(name)r is %(status)s: run createlocktable again later.")
                % {"name": status.name, "status": status.ttl_status}
            )
