"""Validated, immutable options of one lock client, and the one statement of each
option's name, default and rules.

``SETTINGS`` lists every option: its ``ClientOptions`` field (the ``DYNLOCK`` setting
is the same name in capitals), its default, what it must be and, for numbers, its
range. The rules that involve more than one value, or that only a full check applies,
are the functions below it. ``ClientOptions`` applies the rules a client cannot work
without; the Django side (``conf.py``) applies them all to ``settings.DYNLOCK`` and
reports each as a system check. Nothing here talks to the network.
"""

from __future__ import annotations

import functools
import inspect
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, cast
from urllib.parse import urlsplit

import boto3
import botocore.session
from botocore.config import Config
from botocore.exceptions import InvalidRegionError
from botocore.utils import validate_region_name

from ..exceptions import InvalidArgument
from . import items
from .failures import safe_endpoint
from .keys import MAX_KEY_BYTES, validate_key

# DynamoDB's own rule for table names.
TABLE_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{3,255}$")

# Leases need calls that fail fast: botocore's defaults (60 s connect, 60 s read,
# legacy retries) can outlast a whole lease. Our own loops retry within `wait`.
DEFAULT_CLIENT_CONFIG: dict[str, Any] = {
    "connect_timeout": 1.0,
    "read_timeout": 2.0,
    # One attempt per request: LockClient retries itself, quickly (botocore's backoff
    # sleeps up to a second), and its acquire loop retries within `wait`.
    "retries": {"mode": "standard", "total_max_attempts": 1},
    "max_pool_connections": 32,
    "tcp_keepalive": True,
}


def check_seconds(name: str, value: Any, *, allow_zero: bool = False, allow_none: bool = False) -> float | None:
    """Return ``value`` as a float, or raise InvalidArgument saying what is wrong."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgument(f"{name} must be a number of seconds, got {value!r}")
    seconds = float(value)
    if math.isnan(seconds) or math.isinf(seconds):
        raise InvalidArgument(f"{name} must be a finite number of seconds, got {seconds!r}")
    if seconds < 0 or (seconds == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise InvalidArgument(f"{name} must be {bound} seconds, got {seconds!r}")
    return seconds


def merge_client_config(user: Config | dict[str, Any] | None) -> Config:
    """Our lease-friendly defaults with the user's botocore Config merged over them."""
    config = Config(**DEFAULT_CLIENT_CONFIG)
    if user:
        config = config.merge(user if isinstance(user, Config) else Config(**user))
    return config


# Requests the LockClient makes for one call when they fail transiently (its acquire
# loop retries on its own, within `wait`), at the least: more if the botocore config
# asks for more attempts.
CALL_ATTEMPTS = 3


def configured_attempts(config: Config) -> int:
    """The attempts per request a botocore Config asks for (its own default when unset)."""
    retries = config.retries or {}
    attempts = retries.get("total_max_attempts")
    if attempts is None:
        attempts = retries.get("max_attempts", 4 if retries.get("mode") == "legacy" else 2) + 1
    return max(1, int(attempts))


def call_attempts(config: Config) -> int:
    """Requests the LockClient makes for one call: CALL_ATTEMPTS, or the config's attempts if more."""
    return max(CALL_ATTEMPTS, configured_attempts(config))


def without_botocore_retries(config: Config) -> Config:
    """The config the boto3 client is built with: one attempt per request.

    The LockClient makes the attempts itself (``call_attempts``), a few milliseconds
    apart. botocore's own backoff sleeps up to a second on a throttled request (its
    base for throttling): a holder whose release is throttled would keep every
    waiter out that long.
    """
    return config.merge(Config(retries={"mode": "standard", "total_max_attempts": 1}))


# The shortest our default timeouts get when fitted to a short lease (see
# fitted_client_config): half of connect 1 s, read 2 s.
MIN_TIMEOUT_SCALE = 0.5


def fitted_client_config(lease_duration: float) -> dict[str, Any]:
    """Our default CLIENT_CONFIG arguments, timeouts shortened so that one call fits in
    half of ``lease_duration`` (down to ``MIN_TIMEOUT_SCALE`` of them).

    For an alias that sets no CLIENT_CONFIG: the defaults are ours, so a short lease the
    docs recommend (10 s) gets timeouts that suit it instead of a warning about them.
    """
    config = dict(DEFAULT_CLIENT_CONFIG)
    budget = call_budget(Config(**config))
    scale = max(MIN_TIMEOUT_SCALE, min(1.0, lease_duration / 2 / budget))
    if scale < 1.0:
        # Rounded down to milliseconds: rounding up could leave the call a hair over half.
        config["connect_timeout"] = math.floor(config["connect_timeout"] * scale * 1000) / 1000
        config["read_timeout"] = math.floor(config["read_timeout"] * scale * 1000) / 1000
    return config


def default_heartbeat_period(lease_duration: float) -> float:
    """HEARTBEAT_PERIOD when an alias sets none: its default, or a third of a shorter lease."""
    return min(float(_DEFAULT["heartbeat_period"]), lease_duration / 3)


def lease_fitted_defaults(lease_duration: float) -> dict[str, Any]:
    """The defaults that follow the lease, by ClientOptions field (as a setting gives
    them): what ``ClientOptions`` and a ``DYNLOCK`` alias (conf.py) both take for an
    option left out. Fixed defaults would not do: a heartbeat every 10 s is refused
    for a lease under 30 s, and 1 + 2 s timeouts tried three times outlast half a lease
    under 18 s, so that a hanging renewal lost the lease before it could be at risk."""
    return {
        "heartbeat_period": default_heartbeat_period(lease_duration),
        "client_config": fitted_client_config(lease_duration),
    }


def call_budget(config: Config) -> float:
    """Worst-case seconds one LockClient call can take: every attempt times out.

    Our backoff between attempts is milliseconds and left out. Used by a system
    check against the lease.
    """
    connect = config.connect_timeout if config.connect_timeout is not None else 60
    read = config.read_timeout if config.read_timeout is not None else 60
    return call_attempts(config) * (float(connect) + float(read))


@dataclass(frozen=True)
class Setting:
    """One option: its name, its default, and what its value must be."""

    field: str  # the ClientOptions field; the DYNLOCK setting is ``name``
    default: Any  # as a setting gives it (CLIENT_CONFIG: botocore Config arguments)
    must_be: str  # what the value must be, said to a person
    types: tuple[type, ...]
    nullable: bool = False
    # Numbers: the least value (allowed itself or not), and the value to stay below.
    minimum: float | None = None
    minimum_allowed: bool = True
    below: float | None = None
    seconds: bool = False  # a duration, checked by check_seconds
    secret: bool = False  # may hold credentials: its value is never echoed

    @property
    def name(self) -> str:
        return self.field.upper()

    def has_type(self, value: Any) -> bool:
        return (value is None and self.nullable) or (isinstance(value, self.types) and not isinstance(value, bool))

    def in_range(self, value: Any) -> bool:
        """A number of the right type within the range (a setting without one: True)."""
        if self.minimum is None:
            return True
        if math.isnan(value) or math.isinf(value) or value < self.minimum:
            return False
        if value == self.minimum and not self.minimum_allowed:
            return False
        return self.below is None or value < self.below

    @property
    def bounds(self) -> str:
        """The range in words: ``> 0``, ``>= 0 and < 0.5``."""
        said = f"{'>=' if self.minimum_allowed else '>'} {self.minimum:g}"
        return said + (f" and < {self.below:g}" if self.below is not None else "")


_NUMBER = (int, float)


def _seconds(name: str, default: float | None, *, zero: bool = False, nullable: bool = False) -> Setting:
    return Setting(
        name,
        default,
        "a number of seconds or None" if nullable else "a number of seconds",
        _NUMBER,
        nullable=nullable,
        minimum=0.0,
        minimum_allowed=zero,
        seconds=True,
    )


SETTINGS: tuple[Setting, ...] = (
    Setting("table_name", "django_dynlock", "a string", (str,)),
    Setting("endpoint_url", None, "a URL string or None", (str,), nullable=True, secret=True),
    Setting("region_name", None, "a region name string or None", (str,), nullable=True),
    Setting("key_prefix", "", "a string", (str,)),
    _seconds("lease_duration", 30.0),
    _seconds("heartbeat_period", 10.0),
    _seconds("wait_timeout", 0.0, zero=True),
    # Retired: takeover follows DynamoDB's clock (see clock.py). Accepted and ignored,
    # so that existing settings keep working; the Django check dynlock.W002 says so.
    _seconds("max_clock_skew", None, zero=True, nullable=True),
    _seconds("retention", 604800.0, zero=True),
    Setting(
        "client_config",
        {},
        "a dict of botocore Config arguments or a botocore Config",
        (dict, Config),
        secret=True,
    ),
    Setting("session_options", {}, "a dict of boto3 Session arguments", (dict,), secret=True),
    # The holder stops trusting its lease this fraction of a lease before the waiters
    # may take over: room for clock-rate drift and for the gap between a check and
    # the side effect it guards.
    Setting("safety_margin", 0.1, "a fraction of the lease", _NUMBER, minimum=0.0, below=0.5),
    _seconds("min_retry_delay", 0.01),
    _seconds("max_retry_delay", 0.025),
    Setting("key_attribute", "key", "an attribute name string", (str,)),
    Setting("ttl_attribute", "gc_at", "an attribute name string", (str,)),
    # How requests reach DynamoDB: "dynlock" (engine/wire.py: botocore's signer and
    # connection pool, without its per-request machinery) or "boto3" (the boto3 client's methods).
    Setting("wire", "dynlock", "'dynlock' or 'boto3'", (str,)),
    # The least a request waits for its reply before a copy of it goes out (engine/hedging.py);
    # None: never. Later than that when this client's round trips are slower (3 x their p90).
    _seconds("hedge_after", None, nullable=True),
)
SETTING = {setting.field: setting for setting in SETTINGS}
_DEFAULT = {setting.field: setting.default for setting in SETTINGS}

# The attributes of the lock item: KEY_ATTRIBUTE and TTL_ATTRIBUTE must be none of them.
ITEM_ATTRIBUTES = frozenset(
    {
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
)
KEY_PAIR = ("aws_access_key_id", "aws_secret_access_key")


# -- the rules over more than one value, or beyond a value's type and range -------------
def valid_table_name(name: str) -> bool:
    return bool(TABLE_NAME_RE.match(name or ""))


def heartbeat_too_slow(lease_duration: float, heartbeat_period: float) -> bool:
    """A lease must survive a failed heartbeat or two: a period of at most a third of it."""
    return heartbeat_period * 3 > lease_duration


def retry_delays_crossed(min_retry_delay: float, max_retry_delay: float) -> bool:
    return min_retry_delay > max_retry_delay


def session_arguments() -> set[str]:
    """The arguments boto3's Session takes (SESSION_OPTIONS may give only these)."""
    return set(inspect.signature(boto3.session.Session.__init__).parameters) - {"self"}


def half_key_pair(session_options: Mapping[str, Any]) -> tuple[str, str] | None:
    """(the key given, the one missing) when only half an access key pair is given:
    boto3 would sign with it, and AWS refuse that only later, obscurely."""
    given = [name for name in KEY_PAIR if name in session_options]
    if len(given) != 1:
        return None
    return given[0], next(name for name in KEY_PAIR if name != given[0])


# The choices of WIRE: the engine's own wire path (engine/wire.py), or the boto3 client's methods.
WIRE_CHOICES = ("dynlock", "boto3")


def valid_wire(wire: object) -> bool:
    return wire in WIRE_CHOICES


def valid_endpoint(url: str) -> bool:
    parts = urlsplit(url)
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def prefix_leaves_no_room(key_prefix: str) -> bool:
    return len(key_prefix.encode()) >= MAX_KEY_BYTES


def unusable_attribute(name: str) -> bool:
    """KEY_ATTRIBUTE and TTL_ATTRIBUTE: empty, or an attribute the lock item uses."""
    return not name or name in ITEM_ATTRIBUTES


def valid_region(region: str) -> bool:
    try:
        validate_region_name(region)  # botocore's own rule, the one the client applies
    except InvalidRegionError:
        return False
    return True


@functools.cache
def known_regions() -> frozenset[str]:
    """The regions botocore's bundled endpoint data lists for DynamoDB, in every
    partition (aws, aws-cn, aws-us-gov, ...). Read from disk: no network."""
    session = botocore.session.get_session()
    return frozenset(
        region
        for partition in session.get_available_partitions()
        for region in session.get_available_regions("dynamodb", partition_name=partition)
    )


def region_left_to_hosts(region_name: str | None, endpoint_url: str | None) -> bool:
    """Against AWS without a region, each host takes its own environment's: two hosts
    that resolve different regions lock in different tables."""
    return region_name is None and endpoint_url is None


@dataclass(frozen=True)
class ClientOptions:
    """Everything a :class:`~django_dynlock.engine.client.LockClient` needs to know."""

    # Defaults and rules: SETTINGS above.
    table_name: str = _DEFAULT["table_name"]
    endpoint_url: str | None = _DEFAULT["endpoint_url"]
    region_name: str | None = _DEFAULT["region_name"]
    key_prefix: str = _DEFAULT["key_prefix"]
    lease_duration: float = _DEFAULT["lease_duration"]
    # Left out (None): fitted to lease_duration (lease_fitted_defaults), as for a DYNLOCK alias.
    heartbeat_period: float = cast(float, None)
    wait_timeout: float = _DEFAULT["wait_timeout"]
    max_clock_skew: float | None = _DEFAULT["max_clock_skew"]  # retired: see SETTINGS
    retention: float = _DEFAULT["retention"]
    safety_margin: float = _DEFAULT["safety_margin"]
    min_retry_delay: float = _DEFAULT["min_retry_delay"]
    max_retry_delay: float = _DEFAULT["max_retry_delay"]
    key_attribute: str = _DEFAULT["key_attribute"]
    ttl_attribute: str = _DEFAULT["ttl_attribute"]
    wire: str = _DEFAULT["wire"]
    hedge_after: float | None = _DEFAULT["hedge_after"]
    alias: str = "default"
    # Left out (None): our defaults, their timeouts fitted to lease_duration (as heartbeat_period).
    client_config: Config = field(default=cast(Config, None), repr=False, compare=False)
    # Holds credentials: never shown in repr, logs or errors.
    session_options: dict[str, Any] = field(
        default_factory=lambda: dict(_DEFAULT["session_options"]), repr=False, compare=False
    )

    def __repr__(self) -> str:
        # Not the dataclass' own: ENDPOINT_URL may carry a proxy's user:password.
        shown = {f.name: getattr(self, f.name) for f in fields(self) if f.repr}
        if self.endpoint_url:
            shown["endpoint_url"] = safe_endpoint(self.endpoint_url)
        return f"ClientOptions({', '.join(f'{name}={value!r}' for name, value in shown.items())})"

    def __post_init__(self) -> None:
        check_seconds("lease_duration", self.lease_duration)
        fitted = lease_fitted_defaults(self.lease_duration)
        if cast(Any, self.heartbeat_period) is None:
            object.__setattr__(self, "heartbeat_period", fitted["heartbeat_period"])
        if cast(Any, self.client_config) is None:
            object.__setattr__(self, "client_config", merge_client_config(fitted["client_config"]))
        # The rules a client cannot work without; conf.py checks a DYNLOCK alias for all.
        if not valid_table_name(self.table_name):
            raise InvalidArgument(
                f"table name {self.table_name!r} is invalid: DynamoDB needs 3-255 characters from A-Z a-z 0-9 _ . -"
            )
        for setting in SETTINGS:
            if setting.seconds:
                check_seconds(
                    setting.field,
                    getattr(self, setting.field),
                    allow_zero=setting.minimum_allowed,
                    allow_none=setting.nullable,
                )
        if heartbeat_too_slow(self.lease_duration, self.heartbeat_period):
            raise InvalidArgument(
                f"heartbeat_period ({self.heartbeat_period}s) must be at most a third of "
                f"lease_duration ({self.lease_duration}s)"
            )
        margin = SETTING["safety_margin"]
        if not margin.in_range(self.safety_margin):
            raise InvalidArgument(
                f"safety_margin must be a fraction in [{margin.minimum:g}, {margin.below:g}), got {self.safety_margin!r}"
            )
        if retry_delays_crossed(self.min_retry_delay, self.max_retry_delay):
            raise InvalidArgument("min_retry_delay must not exceed max_retry_delay")
        if not valid_wire(self.wire):
            raise InvalidArgument(f"wire must be one of {', '.join(map(repr, WIRE_CHOICES))}, got {self.wire!r}")

    @property
    def call_attempts(self) -> int:
        return call_attempts(self.client_config)

    def prefixed(self, key: str) -> str:
        """The stored partition key for a user's key, validated before any network call."""
        return validate_key(self.key_prefix, key)
