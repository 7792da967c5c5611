"""The FaultProxy request log (``record=True``) that the scenarios use to explain lost time."""

from __future__ import annotations

import time

import pytest
from botocore.exceptions import ClientError, ConnectionClosedError, ReadTimeoutError

from localdynamo.faultproxy import FaultProxy
from localdynamo.servers import dummy_client
from tests.reliability.harness import create_table
from tests.support.tables import delete_table


def test_the_log_says_what_happened_to_each_request(moto_server):
    table = create_table(moto_server.endpoint_url)
    try:
        with FaultProxy(moto_server.endpoint_url, max_seconds=30, record=True) as proxy:
            client = dummy_client(proxy.endpoint_url, read_timeout=0.3)
            key = {"key": {"S": "a"}}
            proxy.add_fault("throttle", operation="GetItem")
            proxy.add_fault("drop_reply", operation="PutItem")
            proxy.add_fault("delay", operation="DeleteItem", delay_seconds=0.6)
            with pytest.raises(ClientError):
                client.get_item(TableName=table, Key=key)
            with pytest.raises(ConnectionClosedError):
                client.put_item(TableName=table, Item=key)
            client.get_item(TableName=table, Key=key)
            with pytest.raises(ReadTimeoutError):
                client.delete_item(TableName=table, Key=key)
            time.sleep(0.5)  # the delayed request goes through after the client gave up
            client.close()
            log = list(proxy.log)
        assert [(r.operation, r.fault, r.upstream, r.status) for r in log] == [
            ("GetItem", "throttle", None, 400),  # answered by the proxy, never forwarded
            ("PutItem", "drop_reply", 200, None),  # applied upstream, no reply
            ("GetItem", None, 200, 200),
            ("DeleteItem", "delay", 200, log[3].status),  # applied; the reply met a closed socket, or not
        ]
        assert all(r.answered is not None and r.answered >= r.received for r in log)
        assert log[3].answered - log[3].received >= 0.6
        assert log[1].body["Item"] == {"key": {"S": "a"}}
    finally:
        delete_table(moto_server.endpoint_url, table)


def test_no_log_unless_asked(moto_server):
    with FaultProxy(moto_server.endpoint_url, max_seconds=30) as proxy:
        client = dummy_client(proxy.endpoint_url)
        client.list_tables()
        client.close()
    assert proxy.log == [] and proxy.stats.requests == 1
