"""The admin's object id of a lease: its key, and its alias when not the default, in one
URL segment that survives browsers, proxies and the admin log.

Most keys are their own id (``order:42``), readable in the address bar and in the
admin log. A key that a URL cannot carry as it is gets an encoded id, ``~`` followed by
the key in base64url (and ``.`` and the alias in base64url for an alias other than the
default):

- ``.`` and ``..``: browsers resolve them as path segments, so the break link of ``.``
  would open the detail page of a key named ``break``;
- long keys: percent-encoded, a 2 KB key of accented letters is 6 KB of URL, beyond the
  request line that common servers accept (gunicorn's 4094 bytes); base64url is 2.7 KB;
- keys with control, bidi or other unprintable characters (a NUL would also make the
  admin log's entry fail on PostgreSQL);
- keys that start with ``~`` themselves, so that an encoded id is never ambiguous.

The admin log links a break to ``admin:django_dynlock_lease_change`` with the id alone
(``LogEntry.get_admin_url``), which is why the alias is part of the id and not only of
the query string.
"""

from __future__ import annotations

import base64
import binascii
import re
from urllib.parse import quote as percent_encode

from django.contrib.admin.utils import quote

from .conf import DEFAULT_ALIAS

ENCODED = "~"
#: The longest readable id, as percent-encoded in a URL; longer keys are encoded.
READABLE_URL_MAX = 512
_BASE64URL = re.compile(r"[A-Za-z0-9_-]*")


def _encode(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode("utf-8")).decode("ascii").rstrip("=")


def _decode(part: str) -> str:
    if not _BASE64URL.fullmatch(part):
        raise ValueError("not base64url")
    try:
        return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError) as exc:
        raise ValueError("not base64url") from exc


def is_readable(key: str) -> bool:
    """Whether ``key`` can be its own id in a URL."""
    return (
        key not in (".", "..")
        and not key.startswith(ENCODED)
        and key.isprintable()
        and len(percent_encode(quote(key), safe="/_")) <= READABLE_URL_MAX
    )


def object_id(key: str, alias: str = DEFAULT_ALIAS) -> str:
    """The id of ``key`` in ``alias``: the key itself when a URL carries it as it is."""
    if alias == DEFAULT_ALIAS and is_readable(key):
        return key
    return ENCODED + _encode(key) + ("" if alias == DEFAULT_ALIAS else "." + _encode(alias))


def parse(object_id: str) -> tuple[str, str | None]:
    """(key, alias) of an id; the alias is None when the id does not name one.

    An id that starts with ``~`` but does not decode is taken as a key: the admin log
    of an earlier version holds keys as they were.
    """
    if object_id.startswith(ENCODED):
        key_part, dot, alias_part = object_id[len(ENCODED) :].partition(".")
        try:
            key = _decode(key_part)
            alias = _decode(alias_part) if dot else None
        except ValueError:
            return object_id, None
        if key and (alias is None or alias):
            return key, alias
    return object_id, None
