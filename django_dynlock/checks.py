"""System checks: the DYNLOCK setting at startup, and the table itself on request.

Configuration checks never touch the network. The table check connects to DynamoDB,
so it is a deployment check: ``manage.py check --deploy`` runs it (with the rest),
``manage.py check --deploy --tag dynlock_table`` runs it with the configuration checks.
"""

from __future__ import annotations

from typing import Any

from django.core import checks
from django.utils.translation import gettext as _

from . import conf, keytemplates
from .engine.keys import MAX_LIMIT
from .exceptions import DynLockError, TableNotFound

TAG = "dynlock"
TABLE_TAG = "dynlock_table"


def _message(problem: conf.SettingProblem) -> checks.CheckMessage:
    level = checks.Error if problem.is_error else checks.Warning
    return level(problem.msg, hint=problem.hint, id=problem.id)


def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    return [_message(problem) for problem in conf.problems()]


#: A LeaderScheduler's beat must tick at least this many times a lease
#: (``beat_max_loop_interval`` <= lease / BEAT_TICKS_PER_LEASE), as the heartbeat renews.
BEAT_TICKS_PER_LEASE = 3
# The Django settings Celery's Django set-up reads (``config_from_object("django.conf:settings",
# namespace="CELERY")``): the only Celery configuration a check can see without the app.
CELERY_PREFIX = "CELERY_"
LEADER_SCHEDULER = "django_dynlock.celery.LeaderScheduler"
#: celery.beat's DEFAULT_MAX_INTERVAL: how long beat sleeps at most when nothing sets it.
BEAT_DEFAULT_MAX_INTERVAL = 300.0


def beat_loop_warning(max_interval: float, lease: float, where: str) -> checks.Warning | None:
    """dynlock.W005 when beat may sleep longer than a third of the lease: a term could
    then run out between two ticks, and a leader that lost it would not campaign again,
    nor a standby look, until beat wakes (the sends themselves are checked one by one)."""
    if max_interval <= lease / BEAT_TICKS_PER_LEASE:
        return None
    return checks.Warning(
        _(
            "Celery beat with django_dynlock.celery.LeaderScheduler may sleep %(interval)gs between "
            "ticks (%(where)s), more than a third of its election's lease (%(lease)gs): a term can run "
            "out between two ticks unnoticed."
        )
        % {"interval": max_interval, "where": where, "lease": lease},
        hint=_("Set beat_max_loop_interval (CELERY_BEAT_MAX_LOOP_INTERVAL) to %(most)g or less, or lengthen the lease.")
        % {"most": lease / BEAT_TICKS_PER_LEASE},
        id="dynlock.W005",
    )


def _names_leader_scheduler(value: Any) -> bool:
    if isinstance(value, str):
        return value.replace(":", ".") == LEADER_SCHEDULER
    return isinstance(value, type) and any(
        f"{k.__module__}.{k.__qualname__}" == LEADER_SCHEDULER for k in value.__mro__
    )


def check_beat(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """dynlock.W005 from the Django settings of a project whose beat runs LeaderScheduler
    (``CELERY_BEAT_SCHEDULER``). A beat started with ``-S`` or ``--max-interval`` logs
    the same warning at startup instead: no setting shows them."""
    from django.conf import settings

    scheduler = getattr(settings, CELERY_PREFIX + "BEAT_SCHEDULER", None)
    if not _names_leader_scheduler(scheduler):
        return []
    lease = getattr(settings, CELERY_PREFIX + "DYNLOCK_BEAT_LEASE", None)
    if lease is None:
        try:
            lease = conf.get_options(
                getattr(settings, CELERY_PREFIX + "DYNLOCK_BEAT_USING", None) or conf.DEFAULT_ALIAS
            ).lease_duration
        except DynLockError:
            return []  # check_settings reports it
    interval = getattr(settings, CELERY_PREFIX + "BEAT_MAX_LOOP_INTERVAL", None) or None
    where = CELERY_PREFIX + "BEAT_MAX_LOOP_INTERVAL"
    if interval is None:
        # Unset (or 0): the scheduler's own default, 300 s for beat's PersistentScheduler.
        wrapped = getattr(settings, CELERY_PREFIX + "DYNLOCK_BEAT_SCHEDULER", None) or getattr(
            scheduler, "wrapped", None
        )
        interval = _default_max_interval(wrapped)
        where = _("unset: the scheduler's default")
    warning = beat_loop_warning(float(interval), float(lease), where)
    return [warning] if warning is not None else []


def _default_max_interval(wrapped: Any) -> float:
    """How long the wrapped scheduler sleeps at most when beat_max_loop_interval is unset:
    its module's DEFAULT_MAX_INTERVAL (django-celery-beat's DatabaseScheduler sets 5 s in
    its __init__ from it), else its class attribute (beat's 300 s)."""
    import sys

    try:
        from celery.beat import Scheduler
        from celery.utils.imports import symbol_by_name
    except ImportError:
        return BEAT_DEFAULT_MAX_INTERVAL  # no Celery here (a web host): beat's own default
    try:
        scheduler = symbol_by_name(wrapped or "celery.beat:PersistentScheduler")
    except (ImportError, AttributeError, ValueError):
        scheduler = Scheduler
    module = sys.modules.get(getattr(scheduler, "__module__", ""))
    default = getattr(module, "DEFAULT_MAX_INTERVAL", None)
    if isinstance(default, (int, float)) and default > 0:
        return float(default)
    return float(getattr(scheduler, "max_interval", Scheduler.max_interval))


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
                checks.Error(
                    str(exc),
                    hint=_("Run: %(command)s") % {"command": f"python manage.py createlocktable --alias {alias}"},
                    id="dynlock.E101",
                )
            )
            continue
        except DynLockError as exc:
            messages.append(
                checks.Error(
                    _("DYNLOCK[%(alias)r]: cannot check the lock table: %(error)s") % {"alias": alias, "error": exc},
                    hint=_("Check ENDPOINT_URL, REGION_NAME, credentials and IAM permissions."),
                    id="dynlock.E102",
                )
            )
            continue
        if status.key_problem:
            messages.append(
                checks.Error(
                    _("DYNLOCK[%(alias)r]: table %(table)r has the wrong key schema: %(problem)s.")
                    % {"alias": alias, "table": status.name, "problem": status.key_problem},
                    hint=_("Point TABLE_NAME at a new table and run createlocktable, or set KEY_ATTRIBUTE."),
                    id="dynlock.E103",
                )
            )
        if status.replicas and status.multi_region_consistency != "STRONG":
            messages.append(
                checks.Error(
                    _(
                        "DYNLOCK[%(alias)r]: table %(table)r is a global table (replicas in %(regions)s) with "
                        "multi-Region eventual consistency: each Region judges a lock's conditions against its "
                        "own copy, so two Regions can hold the same lock at once."
                    )
                    % {"alias": alias, "table": status.name, "regions": ", ".join(status.replicas)},
                    hint=_(
                        "Use a single-Region table for locks, or a global table created with "
                        "multi-Region strong consistency (MultiRegionConsistency STRONG)."
                    ),
                    id="dynlock.E104",
                )
            )
        strong_global = bool(status.replicas) and status.multi_region_consistency == "STRONG"
        if strong_global:
            messages.append(
                checks.Warning(
                    _(
                        "DYNLOCK[%(alias)r]: table %(table)r is a global table with multi-Region strong "
                        "consistency, where DynamoDB supports neither transactions nor TTL: acquire_many() "
                        "gets an error from DynamoDB, and idle lock items are never deleted (RETENTION has "
                        "no effect)."
                    )
                    % {"alias": alias, "table": status.name},
                    hint=_(
                        "Take several keys with acquire() one at a time, in sorted order; or use a "
                        "single-Region table for locks."
                    ),
                    id="dynlock.W102",
                )
            )
        # TTL cannot be enabled on such a table (W102 says so): no advice to enable it.
        ttl_off = (
            status.ttl_status not in ("ENABLED", "ENABLING") or status.ttl_attribute != client.options.ttl_attribute
        )
        if ttl_off and not strong_global:
            if status.ttl_attribute is None:  # DISABLED: DynamoDB names no attribute
                said = _(
                    "DYNLOCK[%(alias)r]: TTL on table %(table)r is %(status)s, not enabled on "
                    "%(expected)r: idle lock items will pile up."
                )
            else:
                said = _(
                    "DYNLOCK[%(alias)r]: TTL on table %(table)r is %(status)s on %(attribute)r, "
                    "not enabled on %(expected)r: idle lock items will pile up."
                )
            messages.append(
                checks.Warning(
                    said
                    % {
                        "alias": alias,
                        "table": status.name,
                        "status": status.ttl_status,
                        "attribute": status.ttl_attribute,
                        "expected": client.options.ttl_attribute,
                    },
                    hint=_(
                        "Run: python manage.py createlocktable (it enables TTL on an existing table). "
                        "Local servers without TTL support (dynalite) always show this warning."
                    ),
                    id="dynlock.W101",
                )
            )
    return messages


def check_limits(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """dynlock.E017: a function decorated with ``dynamo_lock(limit=N)`` for an N that one
    look at a semaphore cannot read (BatchGetItem reads 100 keys: 99 slots and the limit item)."""
    return [
        checks.Error(
            _("%(where)s: dynamo_lock(limit=%(limit)s) is outside 1-%(most)s")
            % {"where": where, "limit": limit, "most": MAX_LIMIT},
            hint=_(
                "one look at a semaphore reads every slot and its limit item with one BatchGetItem, "
                "which reads at most 100 keys: use a limit of %(most)s at most"
            )
            % {"most": MAX_LIMIT},
            obj=where,
            id="dynlock.E017",
        )
        for where, limit in keytemplates.declared_limits
    ]


# Registered by calls rather than as decorators: Django ships no type hints, and its
# decorator would leave the functions untyped.
# The table check skips an alias whose settings are broken, so a run of its tag alone
# (``check --deploy --tag dynlock_table``) runs the settings checks too: else a broken
# setting would pass it as "no issues".
checks.register(check_settings, TAG, TABLE_TAG)
checks.register(check_beat, TAG)
checks.register(check_limits, TAG)
checks.register(check_tables, TAG, TABLE_TAG, deploy=True)
