"""Fresh lock tables for the tests: the shipped ``lock_table()`` with the suite's settings."""

from __future__ import annotations

from typing import Any

from django_dynlock.testing import lock_table
from localdynamo.servers import table_name
from tests.support.aliases import alias_settings


def fresh_table(settings: Any, endpoint_url: str | None, using: str = "default", **overrides: Any) -> lock_table:
    """``lock_table()`` on ``endpoint_url`` (moto's ``mock_aws`` for None) under this run's
    table prefix, with the suite's alias settings and ``overrides``, through pytest-django's
    ``settings`` fixture (which restores ``DYNLOCK`` after the test)."""
    return lock_table(
        using, settings=settings, endpoint_url=endpoint_url, **alias_settings(endpoint_url, table_name(), **overrides)
    )
