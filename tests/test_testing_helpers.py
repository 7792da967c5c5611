"""django_dynlock.testing: what users get for their own test suites."""

from __future__ import annotations

from django.conf import settings

from django_dynlock import dynamo_lock, get_lock_client
from django_dynlock.testing import lock_table


def test_lock_table_as_context_manager_uses_moto_in_process():
    with lock_table() as client:
        assert settings.DYNLOCK["default"]["ENDPOINT_URL"] is None
        with dynamo_lock("job") as lease:
            assert client.get("job").token == lease.token
    assert settings.DYNLOCK["default"]["ENDPOINT_URL"] == "http://127.0.0.1:9"  # restored


@lock_table(LEASE_DURATION=6.0, HEARTBEAT_PERIOD=2.0)
def test_lock_table_as_decorator_with_overrides():
    assert get_lock_client().options.lease_duration == 6.0
    assert get_lock_client().try_acquire("x") is not None


def test_lock_table_on_a_real_server(moto_server):
    with lock_table(endpoint_url=moto_server.endpoint_url) as client:
        assert client.options.endpoint_url == moto_server.endpoint_url
        client.acquire("k").release()


def test_the_pytest_fixture(dynlock_table):
    assert dynlock_table.try_acquire("fixture") is not None


def test_lock_table_names_its_table_and_changes_settings_through_pytest_djangos_fixture(settings):
    with lock_table(settings=settings, TABLE_NAME="named-by-the-test") as client:
        assert client.options.table_name == "named-by-the-test"
        assert settings.DYNLOCK["default"]["TABLE_NAME"] == "named-by-the-test"
        settings.DYNLOCK = {**settings.DYNLOCK, "reports": {"TABLE_NAME": "r"}}  # the test's own change
        assert client.try_acquire("k") is not None
    # Not restored out of order under the test's own change: the fixture restores both, in order.
    assert settings.DYNLOCK["reports"] == {"TABLE_NAME": "r"}
    assert settings.DYNLOCK["default"]["TABLE_NAME"] == "named-by-the-test"
