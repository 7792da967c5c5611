"""System checks: the DYNLOCK setting at startup, and the table itself on request.

Configuration checks never touch the network. The table check connects to DynamoDB,
so it is a deployment check: ``manage.py check --deploy`` runs it (with the rest),
``manage.py check --deploy --tag dynlock_table`` runs it alone.
"""

from __future__ import annotations

from typing import Any

from django.core import checks

from . import conf
from .exceptions import DynLockError, TableNotFound

TAG = "dynlock"
TABLE_TAG = "dynlock_table"


def _message(problem: conf.SettingProblem) -> checks.CheckMessage:
    level = checks.Error if problem.is_error else checks.Warning
    return level(problem.msg, hint=problem.hint, id=problem.id)


@checks.register(TAG)
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    return [_message(problem) for problem in conf.problems()]


@checks.register(TAG, TABLE_TAG, deploy=True)
def check_tables(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    from .registry import get_lock_client

    messages: list[checks.CheckMessage] = []
    for alias in conf.aliases():
        try:
            client = get_lock_client(alias)
        except DynLockError:
            continue  # check_settings already reports it
        try:
            status = client.describe_table()
        except TableNotFound as exc:
            messages.append(
                checks.Error(str(exc), hint=f"Run: python manage.py createlocktable --alias {alias}", id="dynlock.E101")
            )
            continue
        except DynLockError as exc:
            messages.append(
                checks.Error(
                    f"DYNLOCK[{alias!r}]: cannot check the lock table: {exc}",
                    hint="Check ENDPOINT_URL, REGION_NAME, credentials and IAM permissions.",
                    id="dynlock.E102",
                )
            )
            continue
        if status.key_problem:
            messages.append(
                checks.Error(
                    f"DYNLOCK[{alias!r}]: table {status.name!r} has the wrong key schema: {status.key_problem}.",
                    hint="Point TABLE_NAME at a new table and run createlocktable, or set KEY_ATTRIBUTE.",
                    id="dynlock.E103",
                )
            )
        if status.replicas and status.multi_region_consistency != "STRONG":
            messages.append(
                checks.Error(
                    f"DYNLOCK[{alias!r}]: table {status.name!r} is a global table (replicas in "
                    f"{', '.join(status.replicas)}) with multi-Region eventual consistency: each Region judges "
                    "a lock's conditions against its own copy, so two Regions can hold the same lock at once.",
                    hint="Use a single-Region table for locks, or a global table created with "
                    "multi-Region strong consistency (MultiRegionConsistency STRONG).",
                    id="dynlock.E104",
                )
            )
        if status.ttl_status not in ("ENABLED", "ENABLING") or status.ttl_attribute != client.options.ttl_attribute:
            messages.append(
                checks.Warning(
                    f"DYNLOCK[{alias!r}]: TTL on table {status.name!r} is {status.ttl_status} on {status.ttl_attribute!r}, "
                    f"not enabled on {client.options.ttl_attribute!r}: idle lock items will pile up.",
                    hint="Run: python manage.py createlocktable (it enables TTL on an existing table). "
                    "Local servers without TTL support (dynalite) always show this warning.",
                    id="dynlock.W101",
                )
            )
    return messages
