"""The ``DYNLOCK`` alias settings of the suite's Django tests."""

from __future__ import annotations

from localdynamo.servers import suite_region, suite_session_options

TEST_ALIAS_SETTINGS = {
    "REGION_NAME": suite_region(),
    "SESSION_OPTIONS": suite_session_options(),
    "LEASE_DURATION": 10.0,
    "HEARTBEAT_PERIOD": 1.0,
    "CLIENT_CONFIG": {
        "connect_timeout": 1,
        "read_timeout": 2,
        "retries": {"total_max_attempts": 1, "mode": "standard"},
    },
}


def alias_settings(endpoint_url: str | None, table: str, **overrides) -> dict:
    return {**TEST_ALIAS_SETTINGS, "ENDPOINT_URL": endpoint_url, "TABLE_NAME": table, **overrides}
