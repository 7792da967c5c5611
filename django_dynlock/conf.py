"""The ``DYNLOCK`` setting: its aliases mapped onto ``ClientOptions``, and the cached
per-alias options.

Each setting's name, default and rules are ``engine.options``' (``SETTINGS`` and the
rule functions beside it); here each broken rule gets its system-check id and its
message. Read lazily (never at import) and re-read when a test overrides the setting.
``checks.py`` reports the problems at startup and ``get_options()`` refuses to build a
client from an alias that has errors.
"""

from __future__ import annotations

import difflib
import functools
from dataclasses import dataclass
from typing import Any

from botocore.config import Config
from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from .engine import options as rules
from .engine.keys import MAX_KEY_BYTES
from .engine.options import SETTINGS, ClientOptions, call_budget, merge_client_config
from .exceptions import ConfigurationError

DEFAULT_ALIAS = "default"

#: Every setting of an alias and its default (from ``engine.options.SETTINGS``).
DEFAULTS: dict[str, Any] = {setting.name: setting.default for setting in SETTINGS}


@dataclass(frozen=True)
class SettingProblem:
    """One thing wrong with the setting; ``checks.py`` turns it into a CheckMessage."""

    id: str  # e.g. "dynlock.E004"
    msg: str
    hint: str | None = None

    @property
    def is_error(self) -> bool:
        return ".E" in self.id


# Settings whose values may hold credentials: never echoed in a check or an error.
SECRET_SETTINGS = frozenset(setting.name for setting in SETTINGS if setting.secret)


def _where(alias: str, name: str | None = None) -> str:
    return f"DYNLOCK[{alias!r}][{name!r}]" if name else f"DYNLOCK[{alias!r}]"


def _alias_problems(alias: str, raw: Any) -> list[SettingProblem]:
    if not isinstance(raw, dict):
        return [
            SettingProblem(
                "dynlock.E003",
                f"{_where(alias)} must be a dict of settings, got {type(raw).__name__}.",
                f'Write DYNLOCK = {{"{alias}": {{"TABLE_NAME": "django_dynlock"}}}}.',
            )
        ]
    found: list[SettingProblem] = []
    for name in raw:
        if name not in DEFAULTS:
            close = difflib.get_close_matches(str(name), DEFAULTS, n=1)
            found.append(
                SettingProblem(
                    "dynlock.E004",
                    f"{_where(alias, name)} is not a django-dynlock setting.",
                    f"Did you mean {close[0]!r}?" if close else f"Known settings: {', '.join(DEFAULTS)}.",
                )
            )
    values = {**DEFAULTS, **{k: v for k, v in raw.items() if k in DEFAULTS}}
    typed_ok: dict[str, bool] = {}
    for setting in SETTINGS:
        name, value = setting.name, values[setting.name]
        typed_ok[name] = setting.has_type(value)
        if not typed_ok[name]:
            # Only the type of a setting that may hold secrets (keys, a proxy's password):
            # checks are printed by every manage.py command.
            got = type(value).__name__ if setting.secret else repr(value)
            found.append(
                SettingProblem(
                    "dynlock.E005",
                    f"{_where(alias, name)} must be {setting.must_be}, got {got}.",
                    f"Default: {setting.default!r}.",
                )
            )
    for setting in SETTINGS:
        name, value = setting.name, values[setting.name]
        if typed_ok[name] and value is not None and not setting.in_range(value):
            found.append(
                SettingProblem(
                    "dynlock.E006",
                    f"{_where(alias, name)} must be a finite number {setting.bounds}, got {value!r}.",
                    f"Default: {setting.default!r}.",
                )
            )
    numbers_ok = not any(p.id in ("dynlock.E005", "dynlock.E006") for p in found)
    lease, period = values["LEASE_DURATION"], values["HEARTBEAT_PERIOD"]
    if numbers_ok and rules.heartbeat_too_slow(lease, period):
        found.append(
            SettingProblem(
                "dynlock.E007",
                f"{_where(alias, 'HEARTBEAT_PERIOD')} ({period}s) must be at most a third of LEASE_DURATION ({lease}s).",
                f"Use HEARTBEAT_PERIOD <= {lease / 3:g}, or a longer LEASE_DURATION: a lease must survive "
                "a failed heartbeat or two.",
            )
        )
    if typed_ok["TABLE_NAME"] and not rules.valid_table_name(values["TABLE_NAME"]):
        found.append(
            SettingProblem(
                "dynlock.E008",
                f"{_where(alias, 'TABLE_NAME')} {values['TABLE_NAME']!r} is not a valid DynamoDB table name.",
                "Use 3-255 characters from A-Z a-z 0-9 _ . -",
            )
        )
    config: Config | None = None
    if typed_ok["CLIENT_CONFIG"]:
        try:
            config = merge_client_config(values["CLIENT_CONFIG"])
        except (TypeError, ValueError) as exc:
            found.append(
                SettingProblem(
                    "dynlock.E009",
                    f"{_where(alias, 'CLIENT_CONFIG')} is not valid for botocore.config.Config: {exc}.",
                    "See botocore's Config reference: e.g. {'read_timeout': 2, 'retries': {'total_max_attempts': 2}}.",
                )
            )
    if typed_ok["SESSION_OPTIONS"]:
        unknown = set(values["SESSION_OPTIONS"]) - rules.session_arguments()
        half_pair = rules.half_key_pair(values["SESSION_OPTIONS"])
        if unknown:
            found.append(
                SettingProblem(
                    "dynlock.E010",
                    f"{_where(alias, 'SESSION_OPTIONS')} has unknown boto3 Session arguments: {', '.join(sorted(map(str, unknown)))}.",
                    f"Known: {', '.join(sorted(rules.session_arguments()))}.",
                )
            )
        elif half_pair:
            found.append(
                SettingProblem(
                    "dynlock.E010",
                    f"{_where(alias, 'SESSION_OPTIONS')} has {half_pair[0]} without its other half.",
                    "Give both aws_access_key_id and aws_secret_access_key, or neither (profile, environment, role).",
                )
            )
    url = values["ENDPOINT_URL"]
    if typed_ok["ENDPOINT_URL"] and url is not None and not rules.valid_endpoint(url):
        found.append(
            SettingProblem(
                "dynlock.E011",
                f"{_where(alias, 'ENDPOINT_URL')} must be an http(s) URL with a host, got a value of length {len(url)}.",
                "e.g. 'http://127.0.0.1:8001' for a local server, or None for AWS.",
            )
        )
    if typed_ok["KEY_PREFIX"] and rules.prefix_leaves_no_room(values["KEY_PREFIX"]):
        found.append(
            SettingProblem(
                "dynlock.E012",
                f"{_where(alias, 'KEY_PREFIX')} is {len(values['KEY_PREFIX'].encode())} bytes: no room left for keys.",
                f"DynamoDB partition keys are at most {MAX_KEY_BYTES} bytes; use a short prefix.",
            )
        )
    if numbers_ok and rules.retry_delays_crossed(values["MIN_RETRY_DELAY"], values["MAX_RETRY_DELAY"]):
        found.append(
            SettingProblem(
                "dynlock.E013",
                f"{_where(alias, 'MIN_RETRY_DELAY')} is greater than MAX_RETRY_DELAY.",
                "The retry delay grows from MIN_RETRY_DELAY up to MAX_RETRY_DELAY.",
            )
        )
    for name in ("KEY_ATTRIBUTE", "TTL_ATTRIBUTE"):
        value = values[name]
        if typed_ok[name] and rules.unusable_attribute(value):
            found.append(
                SettingProblem(
                    "dynlock.E014",
                    f"{_where(alias, name)} {value!r} is empty or clashes with an attribute the lock item uses.",
                    f"Reserved: {', '.join(sorted(rules.ITEM_ATTRIBUTES))}.",
                )
            )
    region = values["REGION_NAME"]
    if typed_ok["REGION_NAME"] and region is not None and not rules.valid_region(region):
        found.append(
            SettingProblem(
                "dynlock.E015",
                f"{_where(alias, 'REGION_NAME')} {region!r} is not an AWS region name.",
                "Use one such as 'eu-west-1', or None for the AWS environment's region.",
            )
        )
    if rules.region_left_to_hosts(region, values["ENDPOINT_URL"]):
        found.append(
            SettingProblem(
                "dynlock.W003",
                f"{_where(alias, 'REGION_NAME')} is not set: against AWS each host takes the region from its "
                "own environment (AWS_REGION, AWS_DEFAULT_REGION, its profile). Two hosts that resolve "
                "different regions lock in different tables and never exclude each other.",
                "Set REGION_NAME, e.g. 'eu-west-1'.",
            )
        )
    if typed_ok["KEY_ATTRIBUTE"] and typed_ok["TTL_ATTRIBUTE"] and values["KEY_ATTRIBUTE"] == values["TTL_ATTRIBUTE"]:
        found.append(
            SettingProblem("dynlock.E014", f"{_where(alias)} KEY_ATTRIBUTE and TTL_ATTRIBUTE must differ.", None)
        )
    if numbers_ok and config is not None:
        budget = call_budget(config)
        if budget > lease / 2:
            found.append(
                SettingProblem(
                    "dynlock.W001",
                    f"{_where(alias, 'CLIENT_CONFIG')}: one DynamoDB call can take up to {budget:g}s (attempts x "
                    f"(connect + read timeout)), more than half of LEASE_DURATION ({lease}s).",
                    "A slow heartbeat could outlast the lease: lower connect_timeout, read_timeout or "
                    "retries.total_max_attempts, or lengthen LEASE_DURATION.",
                )
            )
        if values["MAX_CLOCK_SKEW"] is not None:
            found.append(
                SettingProblem(
                    "dynlock.W002",
                    f"{_where(alias, 'MAX_CLOCK_SKEW')} is set, but no longer used: every acquire now takes "
                    "over an expired lease by DynamoDB's own clock, which no host's clock can move.",
                    "Remove MAX_CLOCK_SKEW from the alias.",
                )
            )
    return found


def _raw_setting() -> Any:
    return getattr(settings, "DYNLOCK", {DEFAULT_ALIAS: {}})


@functools.cache
def problems() -> tuple[SettingProblem, ...]:
    """Everything wrong with ``settings.DYNLOCK`` (cached until the setting changes)."""
    raw = _raw_setting()
    if not isinstance(raw, dict):
        return (
            SettingProblem(
                "dynlock.E001",
                f"DYNLOCK must be a dict of aliases like CACHES, got {type(raw).__name__}.",
                'Write DYNLOCK = {"default": {"TABLE_NAME": "django_dynlock"}}.',
            ),
        )
    found: list[SettingProblem] = []
    if DEFAULT_ALIAS not in raw:
        found.append(
            SettingProblem(
                "dynlock.E002",
                "DYNLOCK has no 'default' alias.",
                f"Add DYNLOCK['default'] (aliases present: {', '.join(map(repr, raw)) or 'none'}).",
            )
        )
    for alias, conf in raw.items():
        found.extend(_alias_problems(str(alias), conf))
    return tuple(found)


def aliases() -> list[str]:
    raw = _raw_setting()
    return list(raw) if isinstance(raw, dict) else []


@functools.cache
def get_options(alias: str = DEFAULT_ALIAS) -> ClientOptions:
    """Validated options of one alias; ConfigurationError says what to fix."""
    raw = _raw_setting()
    if not isinstance(raw, dict):
        raise ConfigurationError(problems()[0].msg)
    if alias not in raw:
        raise ConfigurationError(f"DYNLOCK has no alias {alias!r}; configured: {', '.join(map(repr, raw)) or 'none'}")
    errors = [p for p in _alias_problems(alias, raw[alias]) if p.is_error]
    if errors:
        raise ConfigurationError("; ".join(f"{p.msg} {p.hint or ''} ({p.id})".replace("  ", " ") for p in errors))
    values = {**DEFAULTS, **raw[alias]}
    arguments: dict[str, Any] = {}
    for setting in SETTINGS:
        value = values[setting.name]
        if setting.minimum is not None and value is not None:
            value = float(value)  # a number setting may be given as an int
        arguments[setting.field] = value
    arguments["client_config"] = merge_client_config(arguments["client_config"])
    arguments["session_options"] = dict(arguments["session_options"])
    return ClientOptions(alias=alias, **arguments)


def clear_caches() -> None:
    problems.cache_clear()
    get_options.cache_clear()
    from .registry import forget_clients

    forget_clients()


@receiver(setting_changed, dispatch_uid="django_dynlock.conf.setting_changed")
def _on_setting_changed(*, setting: str, **kwargs: Any) -> None:
    if setting == "DYNLOCK":
        clear_caches()
