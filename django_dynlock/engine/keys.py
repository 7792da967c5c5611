"""Lock keys: what the user writes vs. what is stored as the partition key."""

from __future__ import annotations

from ..exceptions import InvalidKey

# DynamoDB's limit for a partition key value.
MAX_KEY_BYTES = 2048


def validate_key(prefix: str, key: object) -> str:
    """Return ``prefix + key``, or raise InvalidKey before any request is sent."""
    if not isinstance(key, str):
        raise InvalidKey(f"a lock key must be a str, got {type(key).__name__}: {key!r}")
    if not key:
        raise InvalidKey("a lock key must not be empty")
    stored = prefix + key
    try:
        size = len(stored.encode("utf-8"))
    except UnicodeEncodeError as exc:  # a lone surrogate (from a broken decode): no UTF-8 for DynamoDB
        raise InvalidKey(
            f"lock key {key[:40]!r} is not valid Unicode: {exc.reason} at position {exc.start - len(prefix)}"
        ) from None
    if size > MAX_KEY_BYTES:
        raise InvalidKey(
            f"lock key {key[:40]!r}... is {size} bytes with its prefix; DynamoDB allows "
            f"{MAX_KEY_BYTES} bytes for a partition key: hash long keys (e.g. hashlib.sha256)"
        )
    return stored
