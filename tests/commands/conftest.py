"""Fixtures of the management commands' tests.

``dynlock`` here is conftest's, but on one lock table per server shared by the tests of
this package and emptied after each one: creating a table per test cost more than the
tests. ``other`` is a second, independent client on it; ``probe`` an inner command for
runlocked.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.core.management import get_commands

from django_dynlock import LockClient, get_lock_client
from localdynamo.servers import dummy_client, table_name
from tests.support.aliases import alias_settings
from tests.support.commands import Probe, other_client


@pytest.fixture(scope="package")
def shared_tables() -> Iterator[dict[str, str]]:
    """One lock table per server for this package: {endpoint: table}."""
    tables: dict[str, str] = {}
    yield tables
    for endpoint, name in tables.items():
        boto = dummy_client(endpoint)
        try:
            boto.delete_table(TableName=name)
        except Exception:
            pass
        boto.close()


def empty_table(endpoint: str, name: str) -> None:
    boto = dummy_client(endpoint)
    try:
        for _ in range(100):  # pages of at most 1 MB; these tests write a few hundred items at most
            page = boto.scan(TableName=name, ProjectionExpression="#k", ExpressionAttributeNames={"#k": "key"})
            keys = [{"key": item["key"]} for item in page["Items"]]
            for start in range(0, len(keys), 25):
                boto.batch_write_item(
                    RequestItems={name: [{"DeleteRequest": {"Key": k}} for k in keys[start : start + 25]]}
                )
            if not page.get("LastEvaluatedKey"):
                break
    finally:
        boto.close()


@pytest.fixture
def dynlock(server, settings, shared_tables) -> Iterator[LockClient]:
    """Like conftest's ``dynlock``, but on a table shared by this package's tests and
    emptied after each one: creating a table per test cost more than the tests."""
    name = shared_tables.get(server.endpoint_url)
    settings.DYNLOCK = {"default": alias_settings(server.endpoint_url, name or table_name())}
    client = get_lock_client()
    if name is None:
        client.create_table(wait=True)
        shared_tables[server.endpoint_url] = client.options.table_name
    client.server = server  # type: ignore[attr-defined]
    yield client
    client.close()
    empty_table(server.endpoint_url, client.options.table_name)


@pytest.fixture
def other(dynlock) -> Iterator[LockClient]:
    client = other_client(dynlock)
    yield client
    client.close()


@pytest.fixture
def probe(monkeypatch) -> Probe:
    command = Probe()
    monkeypatch.setitem(get_commands(), "dynlock_probe", command)
    return command
