"""The changelist's page cursor: DynamoDB's ``LastEvaluatedKey`` as a URL-safe string."""

from __future__ import annotations

import base64
import binascii
from typing import Any


def encode_cursor(last_key: dict[str, Any] | None, key_attribute: str) -> str | None:
    """DynamoDB's LastEvaluatedKey as a URL-safe string: the stored key, base64url."""
    if not last_key:
        return None
    stored = last_key[key_attribute]["S"]
    return base64.urlsafe_b64encode(stored.encode()).decode().rstrip("=")


def decode_cursor(cursor: str, key_attribute: str) -> dict[str, Any] | None:
    """The ExclusiveStartKey of a cursor; ValueError if it is not one of ours."""
    if not cursor:
        return None
    try:
        stored = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise ValueError("invalid cursor") from None
    if not stored:
        raise ValueError("invalid cursor")
    return {key_attribute: {"S": stored}}
