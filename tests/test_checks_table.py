"""The lock table: create_table, and the deployment check that inspects it."""

from __future__ import annotations

import pytest
from django.core import checks

from django_dynlock import BackendError, TableSchemaError, get_lock_client
from localdynamo.faultproxy import FaultProxy
from localdynamo.servers import dummy_client, table_name
from tests.support.aliases import alias_settings
from tests.support.clients import client_for
from tests.support.commands import fails


def table_messages() -> list[checks.CheckMessage]:
    """The table check's messages (E1xx, W1xx): the tag also runs the settings checks, and
    the suite's aliases draw W001 (timeouts of 3 s against a 10 s lease, on purpose)."""
    found = checks.run_checks(tags=["dynlock_table"], include_deployment_checks=True)
    return [m for m in found if m.id[len("dynlock.") + 1] == "1"]


def table_check_ids() -> list[str]:
    return [m.id for m in table_messages()]


def test_create_table_is_idempotent_and_the_check_is_clean(dynlock):
    again = dynlock.create_table(wait=True)
    assert not again.created and again.ok
    ids = table_check_ids()
    if dynlock.server.kind != "dynalite":
        assert ids == [] and again.ttl_status == "ENABLED" and again.ttl_attribute == "gc_at"
    else:  # dynalite cannot enable TTL: a warning, not a failure
        assert ids == ["dynlock.W101"]


def test_missing_table(server, settings):
    settings.DYNLOCK = {"default": alias_settings(server.endpoint_url, table_name())}
    assert table_check_ids() == ["dynlock.E101"]
    message = table_messages()[0]
    assert "createlocktable" in message.hint


def test_unreachable_endpoint(settings):
    settings.DYNLOCK = {
        "default": alias_settings(
            "http://127.0.0.1:9",
            "unreachable",
            CLIENT_CONFIG={"connect_timeout": 0.5, "retries": {"total_max_attempts": 1}},
        )
    }
    assert table_check_ids() == ["dynlock.E102"]


def test_wrong_key_schema(server, settings):
    name = table_name()
    dummy_client(server.endpoint_url).create_table(
        TableName=name,
        BillingMode="PAY_PER_REQUEST",
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}, {"AttributeName": "sk", "KeyType": "RANGE"}],
        AttributeDefinitions=[
            {"AttributeName": "pk", "AttributeType": "S"},
            {"AttributeName": "sk", "AttributeType": "S"},
        ],
    )
    settings.DYNLOCK = {"default": alias_settings(server.endpoint_url, name)}
    assert "dynlock.E103" in table_check_ids()
    with pytest.raises(BackendError, match="partition key is 'pk', expected 'key'"):
        get_lock_client().create_table()


@pytest.mark.parametrize("key_type", ["S", "N"])
def test_a_table_keyed_on_another_attribute_is_a_typed_error_at_run_time(server, settings, key_type):
    # issue 31: each request raised a raw ValidationException; showlocks said "No live leases"
    name = table_name()
    key = "pk" if key_type == "S" else "key"  # another name, or our name with another type
    dummy_client(server.endpoint_url).create_table(
        TableName=name,
        BillingMode="PAY_PER_REQUEST",
        KeySchema=[{"AttributeName": key, "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": key, "AttributeType": key_type}],
    )
    settings.DYNLOCK = {"default": alias_settings(server.endpoint_url, name)}
    client = get_lock_client()
    calls = {
        "acquire": lambda: client.acquire("k"),
        "try_acquire": lambda: client.try_acquire("k"),
        "acquire_many": lambda: client.acquire_many(["a", "b"]),
        "break_lease": lambda: client.break_lease("k", token=1, reason="test"),
        "get": lambda: client.get("k"),
    }
    if key_type == "N":
        # Left out: DynamoDB Local cancels the transaction with a ValidationError reason,
        # which multikey.py reads as a conflict to retry (a known gap, reported).
        del calls["acquire_many"]
    for call, request in calls.items():
        with pytest.raises(TableSchemaError) as raised:
            request()
        assert "KEY_ATTRIBUTE" in str(raised.value) and "dynlock.E103" in str(raised.value), call
        assert not raised.value.retryable, call
    error = fails("showlocks")
    assert error.returncode == 3 and "KEY_ATTRIBUTE" in str(error) and "dynlock.E103" in str(error)


def test_ttl_disabled_warns_and_create_table_enables_it(moto_server, settings):
    name = table_name()
    dummy_client(moto_server.endpoint_url).create_table(
        TableName=name,
        BillingMode="PAY_PER_REQUEST",
        KeySchema=[{"AttributeName": "key", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "key", "AttributeType": "S"}],
    )
    settings.DYNLOCK = {"default": alias_settings(moto_server.endpoint_url, name)}
    assert table_check_ids() == ["dynlock.W101"]
    (warning,) = table_messages()
    # issue 31: it read "is DISABLED on None"
    assert "is DISABLED, not enabled on 'gc_at'" in warning.msg and "None" not in warning.msg
    status = get_lock_client().create_table()
    assert not status.created and status.ttl_status == "ENABLED"
    assert table_check_ids() == []


@pytest.mark.parametrize("consistency", [None, "EVENTUAL", "STRONG"])
def test_a_global_table_needs_multi_region_strong_consistency(dynlock, settings, consistency):
    def global_table(reply):
        table = reply["Table"]
        table["Replicas"] = [
            {"RegionName": region, "ReplicaStatus": "ACTIVE"} for region in ("us-east-1", "eu-west-1", "us-west-2")
        ]
        if consistency:
            table["MultiRegionConsistency"] = consistency
        return reply

    with FaultProxy(dynlock.server.endpoint_url, max_seconds=60) as proxy:
        proxy.rewrite_replies("DescribeTable", global_table)
        settings.DYNLOCK = {"default": {**settings.DYNLOCK["default"], "ENDPOINT_URL": proxy.endpoint_url}}
        messages = checks.run_checks(tags=["dynlock_table"], include_deployment_checks=True)
    found = [m for m in messages if m.id == "dynlock.E104"]
    ids = [m.id for m in messages]
    if consistency == "STRONG":
        assert found == []
        # What AWS documents as unsupported there, and no advice to enable TTL.
        (strong,) = [m for m in messages if m.id == "dynlock.W102"]
        assert "transactions" in strong.msg and "TTL" in strong.msg and "acquire_many()" in strong.msg
        assert "dynlock.W101" not in ids
    else:
        assert "dynlock.W102" not in ids
        assert len(found) == 1 and found[0].level == checks.ERROR
        assert "us-east-1, eu-west-1, us-west-2" in found[0].msg and "STRONG" in found[0].hint


def test_a_replicated_write_conflict_is_tried_again(dynlock):
    # A global table with multi-Region strong consistency rejects a write to an item
    # another Region is writing, as retryable. It raised BackendError at once.
    with FaultProxy(dynlock.server.endpoint_url, max_seconds=60) as proxy:
        other = client_for(proxy.endpoint_url, dynlock.options.table_name)
        try:
            conflict = proxy.add_fault("replicated_conflict", operation="UpdateItem")
            lease = other.acquire("replicated", wait=2)
            assert conflict.fired == 1 and lease.is_held
            lease.release()
        finally:
            other.close()
