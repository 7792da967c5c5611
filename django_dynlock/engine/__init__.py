"""The lease engine: plain Python on boto3, no Django imports.

The Django layers (settings, checks, decorator, commands, admin) sit on top of it.
"""

from .client import LockClient
from .election import Election, Observation
from .items import LeaseInfo
from .lease import Handover, Lease, LeaseGroup, LeaseState
from .options import ClientOptions
from .table import TableStatus

__all__ = [
    "ClientOptions",
    "Election",
    "Handover",
    "Lease",
    "LeaseGroup",
    "LeaseInfo",
    "LeaseState",
    "LockClient",
    "Observation",
    "TableStatus",
]
