"""The errors every command shares: alias, settings, endpoint, table, credentials, access."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from localdynamo.servers import table_name
from tests.support.aliases import alias_settings
from tests.support.commands import FAST_FAIL, UNREACHABLE, fails, run
from tests.support.deny_all import TRANSACTION_DENIAL, DenyAllServer, aws_denial

COMMANDS = [
    ["createlocktable"],
    ["showlocks"],
    ["breaklock", "k", "--noinput", "--reason", "test"],
    ["runlocked", "k", "--", "check"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_unknown_alias(settings, command):
    settings.DYNLOCK = {"default": alias_settings(UNREACHABLE, "ttt"), "reports": alias_settings(UNREACHABLE, "ttt")}
    error = fails(command[0], "--alias", "nope", *command[1:])
    assert error.returncode == 2 and str(error) == "unknown alias 'nope': DYNLOCK defines 'default', 'reports'"


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_misconfigured_alias(settings, command):
    settings.DYNLOCK = {"default": {**alias_settings(UNREACHABLE, "ttt"), "LEASE_DURATION": "long"}}
    error = fails(*command)
    assert error.returncode == 2 and "dynlock.E005" in str(error)


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_unreachable_endpoint(settings, command):
    settings.DYNLOCK = {"default": alias_settings(UNREACHABLE, "ttt", CLIENT_CONFIG=FAST_FAIL)}
    error = fails(*command)
    assert error.returncode == 3 and "could not connect to DynamoDB at http://127.0.0.1:9" in str(error)


@pytest.mark.parametrize("command", COMMANDS[1:], ids=lambda c: c[0])
def test_missing_table(server, settings, command):
    settings.DYNLOCK = {"default": alias_settings(server.endpoint_url, table_name())}
    error = fails(*command)
    assert error.returncode == 3 and "does not exist" in str(error) and "createlocktable" in str(error)


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_missing_credentials(moto_server, settings, monkeypatch, command):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    settings.DYNLOCK = {"default": alias_settings(moto_server.endpoint_url, "ttt", SESSION_OPTIONS={})}
    error = fails(*command)
    assert error.returncode == 3 and "no AWS credentials found" in str(error)
    # issue 35: a local server still needs some keys, and the message shows the setting
    assert f"a local server at {moto_server.endpoint_url}, region us-east-1 still needs some keys" in str(error)
    assert "set SESSION_OPTIONS = {'aws_access_key_id': 'local', 'aws_secret_access_key': 'local'}" in str(error)


def keys(key_id: str) -> dict[str, str]:
    return {"aws_access_key_id": key_id, "aws_secret_access_key": f"secret-of-{key_id}"}


def test_dynamodb_local_keeps_a_database_per_access_key(dynamodb_local_server, settings):
    # issue 35: a second set of keys gave TableNotFound, whose hint named only the region
    from django_dynlock import TableNotFound, get_lock_client

    name = table_name()
    settings.DYNLOCK = {
        "default": alias_settings(dynamodb_local_server.endpoint_url, name, SESSION_OPTIONS=keys("first"))
    }
    run("createlocktable", verbosity=0)
    get_lock_client().acquire("k").release()
    settings.DYNLOCK = {
        "default": alias_settings(dynamodb_local_server.endpoint_url, name, SESSION_OPTIONS=keys("second"))
    }
    with pytest.raises(TableNotFound) as raised:
        get_lock_client().acquire("k")
    error = fails("showlocks")
    assert error.returncode == 3
    for message in (str(raised.value), str(error)):
        assert f"does not exist at {dynamodb_local_server.endpoint_url}, region us-east-1: create it" in message
        assert "or, if it was created with other keys, use those: DynamoDB Local keeps one database per " in message
        assert (
            "access key id and region unless started with -sharedDb (this client used access key id 'second')"
            in message
        )
        assert "secret-of" not in message  # the public id only (docs/security.md)


@pytest.fixture(scope="module")
def deny_all() -> Iterator[str]:
    # In a process of its own: in this one, its replies waited for this process to run
    # Python, and a stall of it under load gave "no reply" (tests/support/deny_all.py).
    server = DenyAllServer()
    yield server.endpoint_url
    server.stop()


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_access_denied(deny_all, settings, command):
    settings.DYNLOCK = {"default": alias_settings(deny_all, "ttt")}
    error = fails(*command)
    assert error.returncode == 3 and "access denied to table 'ttt'" in str(error)
    # issue 31: AWS's own text (the refused action) is kept, and the policy that has it named
    operation = str(error).split("is not authorized to perform: dynamodb:")[1].split(" ")[0]
    assert aws_denial(operation) in str(error)
    assert f"Grant the IAM principal dynamodb:{operation} on the table" in str(error)
    if command[0] == "createlocktable":  # DescribeTable: in both policies
        assert "dynamodb:DescribeTimeToLive" in str(error) and "--print iam-deploy" in str(error)
    else:  # a runtime principal is never asked for CreateTable
        assert "--print iam-runtime" in str(error) and "CreateTable" not in str(error)


def test_access_denied_through_the_public_api(deny_all, settings):
    from django_dynlock import BackendError, get_lock_client

    settings.DYNLOCK = {"default": alias_settings(deny_all, "ttt")}
    with pytest.raises(BackendError) as raised:
        get_lock_client().acquire("k")
    message = str(raised.value)
    assert aws_denial("UpdateItem") in message and not raised.value.retryable
    assert "dynamodb:GetItem, dynamodb:UpdateItem" in message and "CreateTable" not in message
    with pytest.raises(BackendError) as raised:
        get_lock_client().create_table()
    assert aws_denial("DescribeTable") in str(raised.value) or aws_denial("CreateTable") in str(raised.value)
    assert "dynamodb:DescribeTimeToLive" in str(raised.value)


def test_access_denied_to_a_transaction_names_its_entries_actions(deny_all, settings):
    # issue 35: the hint asked for dynamodb:TransactWriteItems, an action IAM does not have
    from django_dynlock import BackendError, get_lock_client

    settings.DYNLOCK = {"default": alias_settings(deny_all, "ttt")}
    with pytest.raises(BackendError) as raised:
        get_lock_client().acquire_many(["a", "b"])
    message = str(raised.value)
    assert TRANSACTION_DENIAL in message and "dynamodb:TransactWriteItems" not in message
    assert "Grant the IAM principal each entry's action (dynamodb:UpdateItem for an Update, " in message
    assert (
        "dynamodb:ConditionCheckItem, dynamodb:Scan): `python manage.py createlocktable --print iam-runtime`" in message
    )
