"""Exceptions raised by django-dynlock.

Everything the library raises on purpose derives from :class:`DynLockError`, so
``except DynLockError`` catches lock problems without catching the caller's own
exceptions. This module imports nothing from Django: the lease engine uses it too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .engine.items import LeaseInfo


class DynLockError(Exception):
    """Base class of every error raised by django-dynlock."""


class ConfigurationError(DynLockError):
    """The ``DYNLOCK`` setting (or an argument derived from it) is invalid."""


class InvalidKey(DynLockError, ValueError):
    """A lock key is empty, not a string, or too long for DynamoDB."""


class InvalidArgument(DynLockError, ValueError):
    """An argument such as ``wait`` or ``lease`` is out of range."""


class ClientClosed(DynLockError):
    """The lock client was closed; get a new one with ``get_lock_client()``."""


class BackendError(DynLockError):
    """DynamoDB could not be used: unreachable, throttled, denied or misconfigured.

    ``retryable`` tells whether trying again later may help (timeouts, throttling,
    5xx) or not (a missing table, denied access, bad credentials).
    """

    def __init__(self, message: str, *, code: str | None = None, retryable: bool = False):
        super().__init__(message)
        self.code = code
        self.retryable = retryable


class TableNotFound(BackendError):
    """The lock table does not exist: create it with ``manage.py createlocktable``.

    ``access_key_id``: the public id of the keys the client signed with, which the
    message names (DynamoDB Local keeps a database per access key id and region).
    """

    access_key_id: str | None = None


class TableSchemaError(BackendError):
    """The lock table's key is not ``KEY_ATTRIBUTE`` (a string partition key, no sort
    key): set KEY_ATTRIBUTE, or use a table made by ``createlocktable``."""


class CredentialsError(BackendError):
    """boto3 found no credentials, or DynamoDB rejected them."""


class BreakUnconfirmed(BackendError):
    """A break may have been applied, but DynamoDB's replies were lost and reading the
    key back failed too: whether the lease was broken is not known yet.

    ``LockClient.confirm_break(key, token=..., mark=...)`` tells once DynamoDB answers
    again (the admin does that on the next page it shows).
    """

    def __init__(self, key: str, token: int | None, mark: str):
        super().__init__(
            f"the break of {key!r} (token {token}) may have been applied: DynamoDB's replies were "
            "lost and the key could not be read back; look at it again",
            retryable=True,
        )
        self.key = key
        self.token = token
        self.mark = mark

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.key, self.token, self.mark))


class LockNotAcquired(DynLockError):
    """The lock is held by someone else and ``wait`` ran out.

    ``holder`` is what is known of the current holder (a :class:`LeaseInfo`, or
    ``None`` when the server did not say), ``retry_after`` a suggestion in seconds.
    """

    def __init__(
        self,
        key: str,
        *,
        holder: LeaseInfo | None = None,
        retry_after: float | None = None,
        waited: float = 0.0,
        keys: tuple[str, ...] | None = None,
    ):
        self.key = key
        self.keys = keys or (key,)
        self.holder = holder
        self.retry_after = retry_after
        self.waited = waited
        who = f" by {holder.describe()}" if holder is not None else ""
        after = f"; retry in about {retry_after:.1f}s" if retry_after is not None else ""
        super().__init__(f"lock {key!r} is held{who} (waited {waited:.2f}s{after})")


class SemaphoreConflict(DynLockError):
    """This process asked for a semaphore with another limit than the one stored for its key.

    Raised before anything is written. ``limit`` is what this process asked for,
    ``stored_limit`` what the table says: deploy the same limit everywhere, or change
    the stored one with ``manage.py setlocklimit KEY N`` (docs/semaphores.md).
    """

    def __init__(self, key: str, *, limit: int, stored_limit: int):
        self.key = key
        self.limit = limit
        self.stored_limit = stored_limit
        super().__init__(
            f"semaphore {key!r} has limit {stored_limit} in the table, but this process asked for limit={limit}: "
            f"use limit={stored_limit}, or change the stored limit with "
            f"'manage.py setlocklimit {key} {limit}' once every process asks for it"
        )


class LockLost(DynLockError):
    """The lease ended before its holder released it (expired, taken over or broken).

    ``reason`` is one of ``"expired"`` (no successful heartbeat in time, e.g. an
    outage), ``"taken"`` (another owner holds the key now), ``"broken"`` (an
    operator broke it) or ``"released"`` (it was already released).
    """

    def __init__(self, key: str, token: int | None, reason: str, detail: str = ""):
        self.key = key
        self.token = token
        self.reason = reason
        message = f"lease on {key!r} (token {token}) was lost: {reason}"
        super().__init__(f"{message}; {detail}" if detail else message)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.key, self.token, self.reason))
