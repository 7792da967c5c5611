"""Fresh lock tables for the tests: the shipped ``lock_table()`` with the suite's settings."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from localdynamo.servers import dummy_client, table_name
from tests.support.aliases import alias_settings

if TYPE_CHECKING:
    from django_dynlock.testing import lock_table


def fresh_table(settings: Any, endpoint_url: str | None, using: str = "default", **overrides: Any) -> lock_table:
    """``lock_table()`` on ``endpoint_url`` (moto's ``mock_aws`` for None) under this run's
    table prefix, with the suite's alias settings and ``overrides``, through pytest-django's
    ``settings`` fixture (which restores ``DYNLOCK`` after the test)."""
    from django_dynlock.testing import lock_table

    return lock_table(
        using, settings=settings, endpoint_url=endpoint_url, **alias_settings(endpoint_url, table_name(), **overrides)
    )


def delete_table(endpoint_url: str, table: str) -> None:
    """Delete a table made by other means (a child process, or wrong on purpose), if it is there."""
    boto = dummy_client(endpoint_url)
    try:
        boto.delete_table(TableName=table)
    except Exception:
        pass
    finally:
        boto.close()
