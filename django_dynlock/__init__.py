"""django-dynlock: distributed locks (leases) for Django, stored in Amazon DynamoDB."""

from .decorators import dynamo_lock
from .engine import ClientOptions, Election, Lease, LeaseGroup, LeaseInfo, LeaseState, LockClient, TableStatus
from .exceptions import (
    BackendError,
    BreakUnconfirmed,
    ClientClosed,
    ConfigurationError,
    CredentialsError,
    DynLockError,
    InvalidArgument,
    InvalidKey,
    LockLost,
    LockNotAcquired,
    SemaphoreConflict,
    TableNotFound,
    TableSchemaError,
)
from .registry import get_lock_client

__version__ = "0.1.0"

__all__ = [
    "BackendError",
    "BreakUnconfirmed",
    "ClientClosed",
    "ClientOptions",
    "ConfigurationError",
    "CredentialsError",
    "DynLockError",
    "Election",
    "InvalidArgument",
    "InvalidKey",
    "Lease",
    "LeaseGroup",
    "LeaseInfo",
    "LeaseState",
    "LockClient",
    "LockLost",
    "LockNotAcquired",
    "SemaphoreConflict",
    "TableNotFound",
    "TableSchemaError",
    "TableStatus",
    "dynamo_lock",
    "get_lock_client",
]
