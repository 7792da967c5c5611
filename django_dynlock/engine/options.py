"""Validated, immutable options of one lock client.

The Django side (``conf.py``) builds these from ``settings.DYNLOCK``; plain Python
code can build them directly. Nothing here talks to the network.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields
from typing import Any

from botocore.config import Config

from ..exceptions import InvalidArgument
from .errors import safe_endpoint
from .keys import validate_key

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
    value = float(value)
    if math.isnan(value) or math.isinf(value):
        raise InvalidArgument(f"{name} must be a finite number of seconds, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise InvalidArgument(f"{name} must be {bound} seconds, got {value!r}")
    return value


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


def call_budget(config: Config) -> float:
    """Worst-case seconds one LockClient call can take: every attempt times out.

    Our backoff between attempts is milliseconds and left out. Used by a system
    check against the lease.
    """
    connect = config.connect_timeout if config.connect_timeout is not None else 60
    read = config.read_timeout if config.read_timeout is not None else 60
    return call_attempts(config) * (float(connect) + float(read))


@dataclass(frozen=True)
class ClientOptions:
    """Everything a :class:`~django_dynlock.engine.client.LockClient` needs to know."""

    table_name: str = "django_dynlock"
    endpoint_url: str | None = None
    region_name: str | None = None
    key_prefix: str = ""
    lease_duration: float = 30.0
    heartbeat_period: float = 10.0
    wait_timeout: float = 0.0
    # Retired: takeover follows DynamoDB's clock (see clock.py). Accepted and ignored,
    # so that existing settings keep working; the Django check dynlock.W002 says so.
    max_clock_skew: float | None = None
    retention: float = 604800.0
    # The holder stops trusting its lease this fraction of a lease before the waiters
    # may take over: room for clock-rate drift and for the gap between a check and
    # the side effect it guards.
    safety_margin: float = 0.1
    min_retry_delay: float = 0.01
    max_retry_delay: float = 0.025
    key_attribute: str = "key"
    ttl_attribute: str = "gc_at"
    alias: str = "default"
    client_config: Config = field(default_factory=lambda: merge_client_config(None), repr=False, compare=False)
    # Holds credentials: never shown in repr, logs or errors.
    session_options: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def __repr__(self) -> str:
        # Not the dataclass' own: ENDPOINT_URL may carry a proxy's user:password.
        shown = {f.name: getattr(self, f.name) for f in fields(self) if f.repr}
        if self.endpoint_url:
            shown["endpoint_url"] = safe_endpoint(self.endpoint_url)
        return f"ClientOptions({', '.join(f'{name}={value!r}' for name, value in shown.items())})"

    def __post_init__(self) -> None:
        if not TABLE_NAME_RE.match(self.table_name or ""):
            raise InvalidArgument(
                f"table name {self.table_name!r} is invalid: DynamoDB needs 3-255 characters from A-Z a-z 0-9 _ . -"
            )
        check_seconds("lease_duration", self.lease_duration)
        check_seconds("heartbeat_period", self.heartbeat_period)
        check_seconds("wait_timeout", self.wait_timeout, allow_zero=True)
        check_seconds("max_clock_skew", self.max_clock_skew, allow_zero=True, allow_none=True)
        check_seconds("retention", self.retention, allow_zero=True)
        check_seconds("min_retry_delay", self.min_retry_delay)
        check_seconds("max_retry_delay", self.max_retry_delay)
        if self.heartbeat_period * 3 > self.lease_duration:
            raise InvalidArgument(
                f"heartbeat_period ({self.heartbeat_period}s) must be at most a third of "
                f"lease_duration ({self.lease_duration}s)"
            )
        if not 0 <= self.safety_margin < 0.5:
            raise InvalidArgument(f"safety_margin must be a fraction in [0, 0.5), got {self.safety_margin!r}")
        if self.min_retry_delay > self.max_retry_delay:
            raise InvalidArgument("min_retry_delay must not exceed max_retry_delay")

    @property
    def call_attempts(self) -> int:
        return call_attempts(self.client_config)

    def prefixed(self, key: str) -> str:
        """The stored partition key for a user's key, validated before any network call."""
        return validate_key(self.key_prefix, key)
