"""Lock keys: what the user writes vs. what is stored as the partition key."""

from __future__ import annotations

from ..exceptions import InvalidKey
from .items import LIMIT_SUFFIX, SLOT_MARK

# DynamoDB's limit for a partition key value.
MAX_KEY_BYTES = 2048

# BatchGetItem reads at most 100 keys: one look reads every slot and the limit item.
MAX_LIMIT = 99


def slot_key(stored: str, slot: int) -> str:
    """The stored key of a semaphore's slot: slot 0 is the key's own item, the item a
    lock of the same key holds (so ``limit=1`` is that lock, and a lock holder counts
    as one of the semaphore's holders)."""
    return stored if slot == 0 else f"{stored}{SLOT_MARK}{slot}"


def limit_key(stored: str) -> str:
    """The stored key of the item that stores a semaphore's limit."""
    return f"{stored}{SLOT_MARK}{LIMIT_SUFFIX}"


def validate_key(prefix: str, key: object) -> str:
    """Return ``prefix + key``, or raise InvalidKey before any request is sent."""
    if not isinstance(key, str):
        raise InvalidKey(f"a lock key must be a str, got {type(key).__name__}: {key!r}")
    if not key:
        raise InvalidKey("a lock key must not be empty")
    if SLOT_MARK in key:
        raise InvalidKey(
            f"lock key {key[:40]!r} contains U+FFFF, which marks a semaphore's slot items in the table: "
            "use another character"
        )
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
