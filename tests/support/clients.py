"""LockClients built from plain options, as another host or a child process would build them."""

from __future__ import annotations

from django_dynlock.engine import ClientOptions, LockClient
from django_dynlock.engine.options import merge_client_config
from localdynamo.servers import suite_region, suite_session_options

OPTIONS = dict(region_name=suite_region(), session_options=suite_session_options())


def client_for(endpoint_url: str, table: str, **extra) -> LockClient:
    options = {"lease_duration": 5.0, "heartbeat_period": 1.0, **OPTIONS, **extra}
    options["client_config"] = merge_client_config(options.get("client_config"))
    return LockClient(ClientOptions(endpoint_url=endpoint_url, table_name=table, **options))
