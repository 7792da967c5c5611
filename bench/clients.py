"""How the benchmarks reach a server: the local server itself, raw boto3 clients and lock clients.

Every benchmark talks to a server it started on 127.0.0.1 (``localdynamo.servers``),
with the dummy credentials and region of ``localdynamo`` and one table for the lock
libraries that let us name it.
"""

from __future__ import annotations

from typing import Any

from django_dynlock.engine import ClientOptions, LockClient
from django_dynlock.engine.options import merge_client_config
from localdynamo.servers import DUMMY_CREDENTIALS, DUMMY_REGION, LocalServer

TABLE = "dynlock_bench"
REGION = DUMMY_REGION
SESSION_OPTIONS = dict(DUMMY_CREDENTIALS)
# django-dynlock's lease and heartbeat wherever a benchmark does not choose others.
LEASE_DURATION = 10.0
HEARTBEAT_PERIOD = 2.0


def start_local_server(kind: str) -> LocalServer:
    """One of ``localdynamo.servers.SERVER_KINDS`` on loopback, with the benchmarks'
    timeouts; dynalite creates tables at once (``--createTableMs 0``)."""
    from localdynamo.servers import start_dynalite, start_dynamodb_local, start_moto_server

    if kind == "moto":
        return start_moto_server(timeout=60)
    if kind == "dynalite":
        return start_dynalite(timeout=60, extra_args=["--createTableMs", "0"])
    if kind == "dynamodb-local":
        return start_dynamodb_local(timeout=90)
    raise SystemExit(f"unknown server {kind!r}: use dynamodb-local, moto or dynalite")


def boto_session() -> Any:
    """A boto3 Session of its own (boto3's default session is shared and not thread-safe)."""
    import boto3

    return boto3.session.Session(region_name=REGION, **SESSION_OPTIONS)


def raw_client(endpoint_url: str | None, config: Any = None) -> Any:
    """A bare boto3 DynamoDB client; ``config`` defaults to the library's botocore settings."""
    return boto_session().client(
        "dynamodb", endpoint_url=endpoint_url, region_name=REGION, config=config or merge_client_config(None)
    )


def make_client(endpoint_url: str | None, **extra: Any) -> LockClient:
    """A django-dynlock ``LockClient`` on the bench table; ``extra``: ClientOptions overrides."""
    options = dict(
        endpoint_url=endpoint_url,
        table_name=TABLE,
        region_name=REGION,
        session_options=dict(SESSION_OPTIONS),
        lease_duration=LEASE_DURATION,
        heartbeat_period=HEARTBEAT_PERIOD,
        client_config=merge_client_config(None),
    )
    options.update(extra)
    return LockClient(ClientOptions(**options))


__all__ = [
    "HEARTBEAT_PERIOD",
    "LEASE_DURATION",
    "REGION",
    "SESSION_OPTIONS",
    "TABLE",
    "boto_session",
    "make_client",
    "raw_client",
    "start_local_server",
]
