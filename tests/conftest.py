"""Fixtures: real DynamoDB-compatible servers and a fresh lock table per test.

- ``moto_server`` / ``dynalite_server``: one subprocess each per test session, on a
  free loopback port, always stopped at the end.
- ``server``: parametrised over both, for tests that must hold on either.
- ``dynlock``: a fresh table on ``server`` and ``settings.DYNLOCK`` pointing at it;
  yields the alias' LockClient.
- ``mock_dynlock``: the same on moto's in-process ``mock_aws`` (fast unit tests).
"""

from __future__ import annotations

import os
import uuid

import pytest

# Never read the developer's own AWS configuration or credentials.
for _name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_ROLE_ARN"):
    os.environ.pop(_name, None)
os.environ.update(
    AWS_CONFIG_FILE=os.devnull,
    AWS_SHARED_CREDENTIALS_FILE=os.devnull,
    AWS_ACCESS_KEY_ID="testing",
    AWS_SECRET_ACCESS_KEY="testing",
    AWS_DEFAULT_REGION="us-east-1",
    AWS_EC2_METADATA_DISABLED="true",
)

from tests.servers import LocalServer, dummy_client, dynalite_path, start_dynalite, start_moto_server  # noqa: E402

TEST_ALIAS_SETTINGS = {
    "REGION_NAME": "us-east-1",
    "SESSION_OPTIONS": {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"},
    "LEASE_DURATION": 10.0,
    "HEARTBEAT_PERIOD": 1.0,
    "CLIENT_CONFIG": {"connect_timeout": 1, "read_timeout": 2, "retries": {"total_max_attempts": 1, "mode": "standard"}},
}


def need_dynalite() -> None:
    if dynalite_path() is None:
        message = "dynalite is not installed: run `make node` (npm install)"
        if os.environ.get("CI") == "true":
            pytest.fail(message + " -- required under CI")
        pytest.skip(message)


@pytest.fixture(scope="session")
def moto_server():
    server = start_moto_server()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def dynalite_server():
    need_dynalite()
    server = start_dynalite()
    yield server
    server.stop()


@pytest.fixture(params=["moto", "dynalite"])
def server(request) -> LocalServer:
    return request.getfixturevalue(f"{request.param}_server")


def table_name() -> str:
    return f"dynlock-test-{uuid.uuid4().hex[:12]}"


def alias_settings(endpoint_url: str | None, table: str, **overrides) -> dict:
    return {**TEST_ALIAS_SETTINGS, "ENDPOINT_URL": endpoint_url, "TABLE_NAME": table, **overrides}


@pytest.fixture
def dynlock(server, settings):
    """A fresh lock table on a real server; yields the default alias' LockClient."""
    from django_dynlock import get_lock_client

    table = table_name()
    settings.DYNLOCK = {"default": alias_settings(server.endpoint_url, table)}
    client = get_lock_client()
    client.create_table(wait=True)
    client.server = server  # for tests that need to know where they are
    yield client
    client.close()
    try:
        dummy_client(server.endpoint_url).delete_table(TableName=table)
    except Exception:
        pass


@pytest.fixture
def mock_dynlock(settings):
    """A lock table on moto's in-process mock (no HTTP): for fast unit tests."""
    from moto import mock_aws

    from django_dynlock import get_lock_client

    with mock_aws():
        settings.DYNLOCK = {"default": alias_settings(None, table_name())}
        client = get_lock_client()
        client.create_table(wait=True)
        yield client
        client.close()
