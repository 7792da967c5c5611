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
from django.utils.text import format_lazy
from django.utils.translation import gettext_lazy as _

from .engine import options as rules
from .engine.keys import MAX_KEY_BYTES
from .engine.options import SETTING, SETTINGS, ClientOptions, call_budget, merge_client_config
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


def _problem(id: str, msg: Any, hint: Any = None, **values: Any) -> SettingProblem:
    """A problem whose message and hint (``gettext_lazy`` templates for ``str.format``) stay
    lazy: ``problems()`` is cached, and each check is read in the language active when it
    is shown. Code (setting names, examples) goes in as values, never into the templates."""
    return SettingProblem(id, format_lazy(msg, **values), None if hint is None else format_lazy(hint, **values))


def _nested_example(names: list[str]) -> str:
    """``DYNLOCK = {"default": {"TABLE_NAME": ..., ...}}`` for settings given flat (names
    only: a value may hold credentials)."""
    inner = ", ".join(f'"{name}": ...' for name in names)
    return f'DYNLOCK = {{"{DEFAULT_ALIAS}": {{{inner}}}}}'


def _values(raw: dict[Any, Any]) -> dict[str, Any]:
    """An alias' settings over the defaults, the defaults that follow LEASE_DURATION
    (HEARTBEAT_PERIOD, CLIENT_CONFIG) fitted to it when the alias leaves them unset."""
    values = {**DEFAULTS, **{k: v for k, v in raw.items() if k in DEFAULTS}}
    lease = values["LEASE_DURATION"]
    if SETTING["lease_duration"].has_type(lease) and SETTING["lease_duration"].in_range(lease):
        for name, value in rules.lease_fitted_defaults(lease).items():
            if name.upper() not in raw:
                values[name.upper()] = value
    return values


def _alias_problems(alias: str, raw: Any, flat: list[str] | None = None) -> list[SettingProblem]:
    if not isinstance(raw, dict):
        if flat and alias in flat:  # DYNLOCK = {"TABLE_NAME": ...}: settings where aliases belong
            return [
                _problem(
                    "dynlock.E003",
                    _("{where} must be a dict of settings, got {type}: {name} is a setting, not an alias."),
                    _("DYNLOCK is a dict of aliases, like CACHES: write {example}."),
                    where=_where(alias),
                    type=type(raw).__name__,
                    name=alias,
                    example=_nested_example(flat),
                )
            ]
        return [
            _problem(
                "dynlock.E003",
                _("{where} must be a dict of settings, got {type}."),
                _("Write {example}."),
                where=_where(alias),
                type=type(raw).__name__,
                example=f'DYNLOCK = {{"{alias}": {{"TABLE_NAME": "django_dynlock"}}}}',
            )
        ]
    found: list[SettingProblem] = []
    for name in raw:
        if name not in DEFAULTS:
            close = difflib.get_close_matches(str(name), DEFAULTS, n=1)
            found.append(
                _problem(
                    "dynlock.E004",
                    _("{where} is not a django-dynlock setting."),
                    _("Did you mean {close!r}?") if close else _("Known settings: {known}."),
                    where=_where(alias, name),
                    close=close[0] if close else None,
                    known=", ".join(DEFAULTS),
                )
            )
    values = _values(raw)
    typed_ok: dict[str, bool] = {}
    for setting in SETTINGS:
        name, value = setting.name, values[setting.name]
        typed_ok[name] = setting.has_type(value)
        if not typed_ok[name]:
            # Only the type of a setting that may hold secrets (keys, a proxy's password):
            # checks are printed by every manage.py command.
            got = type(value).__name__ if setting.secret else repr(value)
            found.append(
                _problem(
                    "dynlock.E005",
                    _("{where} must be {must_be}, got {got}."),
                    _("Default: {default!r}."),
                    where=_where(alias, name),
                    must_be=setting.must_be,
                    got=got,
                    default=setting.default,
                )
            )
    for setting in SETTINGS:
        name, value = setting.name, values[setting.name]
        if typed_ok[name] and value is not None and not setting.in_range(value):
            found.append(
                _problem(
                    "dynlock.E006",
                    _("{where} must be a finite number {bounds}, got {value!r}."),
                    _("Default: {default!r}."),
                    where=_where(alias, name),
                    bounds=setting.bounds,
                    value=value,
                    default=setting.default,
                )
            )
    numbers_ok = not any(p.id in ("dynlock.E005", "dynlock.E006") for p in found)
    lease, period = values["LEASE_DURATION"], values["HEARTBEAT_PERIOD"]
    # Left unset, HEARTBEAT_PERIOD follows the lease (_values): only a period given can be too slow.
    if numbers_ok and "HEARTBEAT_PERIOD" in raw and rules.heartbeat_too_slow(lease, period):
        found.append(
            _problem(
                "dynlock.E007",
                _("{where} ({period}s) must be at most a third of LEASE_DURATION ({lease}s)."),
                _(
                    "Use HEARTBEAT_PERIOD <= {third:g}, or a longer LEASE_DURATION: a lease must survive "
                    "a failed heartbeat or two."
                ),
                where=_where(alias, "HEARTBEAT_PERIOD"),
                period=period,
                lease=lease,
                third=lease / 3,
            )
        )
    if typed_ok["TABLE_NAME"] and not rules.valid_table_name(values["TABLE_NAME"]):
        found.append(
            _problem(
                "dynlock.E008",
                _("{where} {value!r} is not a valid DynamoDB table name."),
                _("Use 3-255 characters from {characters}"),
                where=_where(alias, "TABLE_NAME"),
                value=values["TABLE_NAME"],
                characters="A-Z a-z 0-9 _ . -",
            )
        )
    config: Config | None = None
    if typed_ok["CLIENT_CONFIG"]:
        try:
            config = merge_client_config(values["CLIENT_CONFIG"])
        except (TypeError, ValueError) as exc:
            found.append(
                _problem(
                    "dynlock.E009",
                    _("{where} is not valid for botocore.config.Config: {error}."),
                    _("See botocore's Config reference: e.g. {example}."),
                    where=_where(alias, "CLIENT_CONFIG"),
                    error=exc,
                    example="{'read_timeout': 2, 'retries': {'total_max_attempts': 2}}",
                )
            )
    if typed_ok["SESSION_OPTIONS"]:
        unknown = set(values["SESSION_OPTIONS"]) - rules.session_arguments()
        half_pair = rules.half_key_pair(values["SESSION_OPTIONS"])
        if unknown:
            found.append(
                _problem(
                    "dynlock.E010",
                    _("{where} has unknown boto3 Session arguments: {unknown}."),
                    _("Known: {known}."),
                    where=_where(alias, "SESSION_OPTIONS"),
                    unknown=", ".join(sorted(map(str, unknown))),
                    known=", ".join(sorted(rules.session_arguments())),
                )
            )
        elif half_pair:
            found.append(
                _problem(
                    "dynlock.E010",
                    _("{where} has {half} without its other half."),
                    _(
                        "Give both aws_access_key_id and aws_secret_access_key, or neither (profile, environment, role)."
                    ),
                    where=_where(alias, "SESSION_OPTIONS"),
                    half=half_pair[0],
                )
            )
    url = values["ENDPOINT_URL"]
    if typed_ok["ENDPOINT_URL"] and url is not None and not rules.valid_endpoint(url):
        found.append(
            _problem(
                "dynlock.E011",
                _("{where} must be an http(s) URL with a host, got a value of length {length}."),
                _("e.g. {example!r} for a local server, or None for AWS."),
                where=_where(alias, "ENDPOINT_URL"),
                length=len(url),
                example="http://127.0.0.1:8001",
            )
        )
    if typed_ok["KEY_PREFIX"] and rules.prefix_leaves_no_room(values["KEY_PREFIX"]):
        found.append(
            _problem(
                "dynlock.E012",
                _("{where} is {size} bytes: no room left for keys."),
                _("DynamoDB partition keys are at most {limit} bytes; use a short prefix."),
                where=_where(alias, "KEY_PREFIX"),
                size=len(values["KEY_PREFIX"].encode()),
                limit=MAX_KEY_BYTES,
            )
        )
    if numbers_ok and rules.retry_delays_crossed(values["MIN_RETRY_DELAY"], values["MAX_RETRY_DELAY"]):
        found.append(
            _problem(
                "dynlock.E013",
                _("{where} is greater than MAX_RETRY_DELAY."),
                _("The retry delay grows from MIN_RETRY_DELAY up to MAX_RETRY_DELAY."),
                where=_where(alias, "MIN_RETRY_DELAY"),
            )
        )
    for name in ("KEY_ATTRIBUTE", "TTL_ATTRIBUTE"):
        value = values[name]
        if typed_ok[name] and rules.unusable_attribute(value):
            found.append(
                _problem(
                    "dynlock.E014",
                    _("{where} {value!r} is empty or clashes with an attribute the lock item uses."),
                    _("Reserved: {reserved}."),
                    where=_where(alias, name),
                    value=value,
                    reserved=", ".join(sorted(rules.ITEM_ATTRIBUTES)),
                )
            )
    if typed_ok["WIRE"] and not rules.valid_wire(values["WIRE"]):
        found.append(
            _problem(
                "dynlock.E016",
                _("{where} must be one of {choices}, got {value!r}."),
                _("'dynlock' (the default) sends the engine's requests on its own wire path; 'boto3' through boto3."),
                where=_where(alias, "WIRE"),
                choices=", ".join(map(repr, rules.WIRE_CHOICES)),
                value=values["WIRE"],
            )
        )
    region = values["REGION_NAME"]
    if typed_ok["REGION_NAME"] and region is not None and not rules.valid_region(region):
        found.append(
            _problem(
                "dynlock.E015",
                _("{where} {value!r} is not an AWS region name."),
                _("Use one such as {example!r}, or None for the AWS environment's region."),
                where=_where(alias, "REGION_NAME"),
                value=region,
                example="eu-west-1",
            )
        )
    elif (
        typed_ok["REGION_NAME"]
        and region is not None
        and values["ENDPOINT_URL"] is None
        and region not in rules.known_regions()
    ):
        close = difflib.get_close_matches(region, rules.known_regions(), n=1)
        found.append(
            _problem(
                "dynlock.W004",
                _("{where} {value!r} is not a region where botocore knows DynamoDB."),
                _(
                    "Did you mean {close!r}? A region newer than your botocore needs a newer botocore "
                    "(or add dynlock.W004 to SILENCED_SYSTEM_CHECKS)."
                )
                if close
                else _(
                    "Use a region code such as {example!r}. A region newer than your botocore needs a "
                    "newer botocore (or add dynlock.W004 to SILENCED_SYSTEM_CHECKS)."
                ),
                where=_where(alias, "REGION_NAME"),
                value=region,
                close=close[0] if close else None,
                example="eu-west-1",
            )
        )
    if rules.region_left_to_hosts(region, values["ENDPOINT_URL"]):
        found.append(
            _problem(
                "dynlock.W003",
                _(
                    "{where} is not set: against AWS each host takes the region from its "
                    "own environment (AWS_REGION, AWS_DEFAULT_REGION, its profile). Two hosts that resolve "
                    "different regions lock in different tables and never exclude each other."
                ),
                _("Set REGION_NAME, e.g. {example!r}."),
                where=_where(alias, "REGION_NAME"),
                example="eu-west-1",
            )
        )
    if typed_ok["KEY_ATTRIBUTE"] and typed_ok["TTL_ATTRIBUTE"] and values["KEY_ATTRIBUTE"] == values["TTL_ATTRIBUTE"]:
        found.append(
            _problem("dynlock.E014", _("{where} KEY_ATTRIBUTE and TTL_ATTRIBUTE must differ."), where=_where(alias))
        )
    if numbers_ok and config is not None:
        budget = call_budget(config)
        if budget > lease / 2 and "CLIENT_CONFIG" not in raw:
            # Our defaults, already fitted to the lease as far as they go (_values).
            found.append(
                _problem(
                    "dynlock.W001",
                    _(
                        "{where} ({lease}s) is too short for the default request timeouts: one "
                        "DynamoDB call can take up to {budget:g}s, more than half of the lease."
                    ),
                    _(
                        "Lengthen LEASE_DURATION to at least {least:g}s, or set CLIENT_CONFIG with shorter "
                        "connect_timeout and read_timeout."
                    ),
                    where=_where(alias, "LEASE_DURATION"),
                    budget=budget,
                    lease=lease,
                    least=budget * 2,
                )
            )
        elif budget > lease / 2:
            found.append(
                _problem(
                    "dynlock.W001",
                    _(
                        "{where}: one DynamoDB call can take up to {budget:g}s (attempts x "
                        "(connect + read timeout)), more than half of LEASE_DURATION ({lease}s)."
                    ),
                    _(
                        "A slow heartbeat could outlast the lease: lower connect_timeout, read_timeout or "
                        "retries.total_max_attempts, or lengthen LEASE_DURATION."
                    ),
                    where=_where(alias, "CLIENT_CONFIG"),
                    budget=budget,
                    lease=lease,
                )
            )
        if values["MAX_CLOCK_SKEW"] is not None:
            found.append(
                _problem(
                    "dynlock.W002",
                    _(
                        "{where} is set, but no longer used: every acquire now takes "
                        "over an expired lease by DynamoDB's own clock, which no host's clock can move."
                    ),
                    _("Remove MAX_CLOCK_SKEW from the alias."),
                    where=_where(alias, "MAX_CLOCK_SKEW"),
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
            _problem(
                "dynlock.E001",
                _("DYNLOCK must be a dict of aliases like CACHES, got {type}."),
                _("Write {example}."),
                type=type(raw).__name__,
                example='DYNLOCK = {"default": {"TABLE_NAME": "django_dynlock"}}',
            ),
        )
    found: list[SettingProblem] = []
    flat = [str(name) for name in raw if name in DEFAULTS]
    if DEFAULT_ALIAS not in raw:
        found.append(
            _problem(
                "dynlock.E002",
                _("DYNLOCK has no 'default' alias."),
                _("DYNLOCK is a dict of aliases, like CACHES: write {example}.")
                if flat
                else _("Add DYNLOCK['default'] (aliases present: {present})."),
                present=", ".join(map(repr, raw)) or _("none"),
                example=_nested_example(flat),
            )
        )
    for alias, conf in raw.items():
        found.extend(_alias_problems(str(alias), conf, flat))
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
        raise ConfigurationError(
            str(_("DYNLOCK has no alias {alias!r}; configured: {configured}")).format(
                alias=alias, configured=", ".join(map(repr, raw)) or _("none")
            )
        )
    errors = [p for p in _alias_problems(alias, raw[alias]) if p.is_error]
    if errors:
        raise ConfigurationError("; ".join(f"{p.msg} {p.hint or ''} ({p.id})".replace("  ", " ") for p in errors))
    values = _values(raw[alias])
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
    """Forget the setting's problems and options, to be read again on next use (when
    DYNLOCK changes: ``registry.py``'s receiver of ``setting_changed`` calls this)."""
    problems.cache_clear()
    get_options.cache_clear()
