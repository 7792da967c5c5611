"""The ``DYNLOCK`` setting: defaults, validation, and the cached per-alias options.

Read lazily (never at import) and re-read when a test overrides the setting. Every
problem found here has a system-check id; ``checks.py`` reports them at startup and
``get_options()`` refuses to build a client from an alias that has errors.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import math
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import boto3
from botocore.config import Config
from botocore.exceptions import InvalidRegionError
from botocore.utils import validate_region_name
from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from .engine import items
from .engine.keys import MAX_KEY_BYTES
from .engine.options import TABLE_NAME_RE, ClientOptions, call_budget, merge_client_config
from .exceptions import ConfigurationError

DEFAULT_ALIAS = "default"

DEFAULTS: dict[str, Any] = {
    "TABLE_NAME": "django_dynlock",
    "ENDPOINT_URL": None,
    "REGION_NAME": None,
    "KEY_PREFIX": "",
    "LEASE_DURATION": 30.0,
    "HEARTBEAT_PERIOD": 10.0,
    "WAIT_TIMEOUT": 0.0,
    "MAX_CLOCK_SKEW": None,
    "RETENTION": 604800.0,
    "CLIENT_CONFIG": {},
    "SESSION_OPTIONS": {},
    "SAFETY_MARGIN": 0.1,
    "MIN_RETRY_DELAY": 0.01,
    "MAX_RETRY_DELAY": 0.025,
    "KEY_ATTRIBUTE": "key",
    "TTL_ATTRIBUTE": "gc_at",
}

_NUMBER = (int, float)
_TYPES: dict[str, tuple[tuple[type, ...], bool, str]] = {
    # name: (accepted types, None allowed, how to say it)
    "TABLE_NAME": ((str,), False, "a string"),
    "ENDPOINT_URL": ((str,), True, "a URL string or None"),
    "REGION_NAME": ((str,), True, "a region name string or None"),
    "KEY_PREFIX": ((str,), False, "a string"),
    "LEASE_DURATION": (_NUMBER, False, "a number of seconds"),
    "HEARTBEAT_PERIOD": (_NUMBER, False, "a number of seconds"),
    "WAIT_TIMEOUT": (_NUMBER, False, "a number of seconds"),
    "MAX_CLOCK_SKEW": (_NUMBER, True, "a number of seconds or None"),
    "RETENTION": (_NUMBER, False, "a number of seconds"),
    "CLIENT_CONFIG": ((dict, Config), False, "a dict of botocore Config arguments or a botocore Config"),
    "SESSION_OPTIONS": ((dict,), False, "a dict of boto3 Session arguments"),
    "SAFETY_MARGIN": (_NUMBER, False, "a fraction of the lease"),
    "MIN_RETRY_DELAY": (_NUMBER, False, "a number of seconds"),
    "MAX_RETRY_DELAY": (_NUMBER, False, "a number of seconds"),
    "KEY_ATTRIBUTE": ((str,), False, "an attribute name string"),
    "TTL_ATTRIBUTE": ((str,), False, "an attribute name string"),
}
# (minimum, minimum allowed, maximum exclusive)
_RANGES: dict[str, tuple[float, bool, float | None]] = {
    "LEASE_DURATION": (0.0, False, None),
    "HEARTBEAT_PERIOD": (0.0, False, None),
    "WAIT_TIMEOUT": (0.0, True, None),
    "MAX_CLOCK_SKEW": (0.0, True, None),
    "RETENTION": (0.0, True, None),
    "SAFETY_MARGIN": (0.0, True, 0.5),
    "MIN_RETRY_DELAY": (0.0, False, None),
    "MAX_RETRY_DELAY": (0.0, False, None),
}
_ITEM_ATTRIBUTES = {
    items.OWNER,
    items.RVN,
    items.FENCE,
    items.LEASE_MS,
    items.EXPIRES_AT,
    items.ACQUIRED_AT,
    items.RELEASED_AT,
    items.RELEASED_BY,
    items.BREAK_REASON,
    items.HOST,
    items.PID,
    items.THREAD,
    items.HOLDER,
    items.SEQ,
    items.RESERVED_BY,
    items.RING,
    *(f"rel{slot}" for slot in range(items.RELEASE_SLOTS)),
}


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
SECRET_SETTINGS = frozenset({"SESSION_OPTIONS", "ENDPOINT_URL", "CLIENT_CONFIG"})


def _where(alias: str, name: str | None = None) -> str:
    return f"DYNLOCK[{alias!r}][{name!r}]" if name else f"DYNLOCK[{alias!r}]"


def _session_arguments() -> set[str]:
    return set(inspect.signature(boto3.session.Session.__init__).parameters) - {"self"}


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
    for name, (types, nullable, said) in _TYPES.items():
        value = values[name]
        ok = (value is None and nullable) or (isinstance(value, types) and not isinstance(value, bool))
        typed_ok[name] = ok
        if not ok:
            # Only the type of a setting that may hold secrets (keys, a proxy's password):
            # checks are printed by every manage.py command.
            got = type(value).__name__ if name in SECRET_SETTINGS else repr(value)
            found.append(
                SettingProblem(
                    "dynlock.E005", f"{_where(alias, name)} must be {said}, got {got}.", f"Default: {DEFAULTS[name]!r}."
                )
            )
    for name, (low, inclusive, high) in _RANGES.items():
        value = values[name]
        if not typed_ok[name] or value is None:
            continue
        bad = math.isnan(value) or math.isinf(value) or value < low or (value == low and not inclusive)
        bad = bad or (high is not None and value >= high)
        if bad:
            bound = f"{'>=' if inclusive else '>'} {low:g}" + (f" and < {high:g}" if high is not None else "")
            found.append(
                SettingProblem(
                    "dynlock.E006",
                    f"{_where(alias, name)} must be a finite number {bound}, got {value!r}.",
                    f"Default: {DEFAULTS[name]!r}.",
                )
            )
    numbers_ok = not any(p.id in ("dynlock.E005", "dynlock.E006") for p in found)
    lease, period = values["LEASE_DURATION"], values["HEARTBEAT_PERIOD"]
    if numbers_ok and period * 3 > lease:
        found.append(
            SettingProblem(
                "dynlock.E007",
                f"{_where(alias, 'HEARTBEAT_PERIOD')} ({period}s) must be at most a third of LEASE_DURATION ({lease}s).",
                f"Use HEARTBEAT_PERIOD <= {lease / 3:g}, or a longer LEASE_DURATION: a lease must survive "
                "a failed heartbeat or two.",
            )
        )
    if typed_ok["TABLE_NAME"] and not TABLE_NAME_RE.match(values["TABLE_NAME"]):
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
        unknown = set(values["SESSION_OPTIONS"]) - _session_arguments()
        pair = {"aws_access_key_id", "aws_secret_access_key"} & set(values["SESSION_OPTIONS"])
        if unknown:
            found.append(
                SettingProblem(
                    "dynlock.E010",
                    f"{_where(alias, 'SESSION_OPTIONS')} has unknown boto3 Session arguments: {', '.join(sorted(map(str, unknown)))}.",
                    f"Known: {', '.join(sorted(_session_arguments()))}.",
                )
            )
        elif len(pair) == 1:
            found.append(
                SettingProblem(
                    "dynlock.E010",
                    f"{_where(alias, 'SESSION_OPTIONS')} has {pair.pop()} without its other half.",
                    "Give both aws_access_key_id and aws_secret_access_key, or neither (profile, environment, role).",
                )
            )
    url = values["ENDPOINT_URL"]
    if typed_ok["ENDPOINT_URL"] and url is not None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            found.append(
                SettingProblem(
                    "dynlock.E011",
                    f"{_where(alias, 'ENDPOINT_URL')} must be an http(s) URL with a host, got a value of length {len(url)}.",
                    "e.g. 'http://127.0.0.1:8001' for a local server, or None for AWS.",
                )
            )
    if typed_ok["KEY_PREFIX"] and len(values["KEY_PREFIX"].encode()) >= MAX_KEY_BYTES:
        found.append(
            SettingProblem(
                "dynlock.E012",
                f"{_where(alias, 'KEY_PREFIX')} is {len(values['KEY_PREFIX'].encode())} bytes: no room left for keys.",
                f"DynamoDB partition keys are at most {MAX_KEY_BYTES} bytes; use a short prefix.",
            )
        )
    if numbers_ok and values["MIN_RETRY_DELAY"] > values["MAX_RETRY_DELAY"]:
        found.append(
            SettingProblem(
                "dynlock.E013",
                f"{_where(alias, 'MIN_RETRY_DELAY')} is greater than MAX_RETRY_DELAY.",
                "The retry delay grows from MIN_RETRY_DELAY up to MAX_RETRY_DELAY.",
            )
        )
    for name in ("KEY_ATTRIBUTE", "TTL_ATTRIBUTE"):
        value = values[name]
        if typed_ok[name] and (not value or value in _ITEM_ATTRIBUTES):
            found.append(
                SettingProblem(
                    "dynlock.E014",
                    f"{_where(alias, name)} {value!r} is empty or clashes with an attribute the lock item uses.",
                    f"Reserved: {', '.join(sorted(_ITEM_ATTRIBUTES))}.",
                )
            )
    region = values["REGION_NAME"]
    if typed_ok["REGION_NAME"] and region is not None:
        try:
            validate_region_name(region)  # botocore's own rule, the one the client applies
        except InvalidRegionError:
            found.append(
                SettingProblem(
                    "dynlock.E015",
                    f"{_where(alias, 'REGION_NAME')} {region!r} is not an AWS region name.",
                    "Use one such as 'eu-west-1', or None for the AWS environment's region.",
                )
            )
    if region is None and values["ENDPOINT_URL"] is None:
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
    return ClientOptions(
        alias=alias,
        table_name=values["TABLE_NAME"],
        endpoint_url=values["ENDPOINT_URL"],
        region_name=values["REGION_NAME"],
        key_prefix=values["KEY_PREFIX"],
        lease_duration=float(values["LEASE_DURATION"]),
        heartbeat_period=float(values["HEARTBEAT_PERIOD"]),
        wait_timeout=float(values["WAIT_TIMEOUT"]),
        max_clock_skew=None if values["MAX_CLOCK_SKEW"] is None else float(values["MAX_CLOCK_SKEW"]),
        retention=float(values["RETENTION"]),
        safety_margin=float(values["SAFETY_MARGIN"]),
        min_retry_delay=float(values["MIN_RETRY_DELAY"]),
        max_retry_delay=float(values["MAX_RETRY_DELAY"]),
        key_attribute=values["KEY_ATTRIBUTE"],
        ttl_attribute=values["TTL_ATTRIBUTE"],
        client_config=merge_client_config(values["CLIENT_CONFIG"]),
        session_options=dict(values["SESSION_OPTIONS"]),
    )


def clear_caches() -> None:
    problems.cache_clear()
    get_options.cache_clear()
    from .registry import forget_clients

    forget_clients()


@receiver(setting_changed, dispatch_uid="django_dynlock.conf.setting_changed")
def _on_setting_changed(*, setting: str, **kwargs: Any) -> None:
    if setting == "DYNLOCK":
        clear_caches()
