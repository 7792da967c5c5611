"""Test helpers for projects that use django-dynlock.

``lock_table()`` gives the code under test a fresh, empty lock table and points the
``DYNLOCK`` alias at it; by default on moto's in-process DynamoDB (``mock_aws``, no
network, needs ``pip install django-dynlock[testing]``), or on any server you pass
as ``endpoint_url`` (e.g. a moto server or dynalite you started). Use it as a
context manager or a decorator::

    from django_dynlock.testing import lock_table

    @lock_table()
    def test_checkout(client):
        ...

With pytest, the ``dynlock_table`` fixture does the same (the plugin is registered
automatically when django-dynlock is installed).

``TABLE_NAME=...`` names the table (default: ``dynlock-test-`` and a random suffix).
With pytest-django, ``lock_table(settings=settings)`` changes ``DYNLOCK`` through its
``settings`` fixture, which restores it after the test: use it in a fixture when the
tests change settings themselves, so that the changes are undone in the right order.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

from django.test import override_settings

from ..conf import DEFAULT_ALIAS, DEFAULTS
from ..engine.client import LockClient
from ..registry import get_lock_client

__all__ = ["lock_table"]

DUMMY_CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}


def _alias_settings(endpoint_url: str | None, table_name: str, overrides: dict[str, Any]) -> dict[str, Any]:
    from django.conf import settings

    current = getattr(settings, "DYNLOCK", {}).get(DEFAULT_ALIAS, {})
    return {
        **{k: v for k, v in current.items() if k in DEFAULTS},
        "TABLE_NAME": table_name,
        "ENDPOINT_URL": endpoint_url,
        "REGION_NAME": "us-east-1",
        "SESSION_OPTIONS": DUMMY_CREDENTIALS,
        **overrides,
    }


class lock_table(contextlib.ContextDecorator):
    """A fresh lock table for the duration of a test; yields the alias' LockClient."""

    def __init__(
        self,
        using: str = DEFAULT_ALIAS,
        *,
        endpoint_url: str | None = None,
        settings: Any = None,
        **settings_overrides: Any,
    ):
        self.using = using
        self.endpoint_url = endpoint_url
        self.settings = settings
        self.overrides = settings_overrides
        self._stack: list[contextlib.ExitStack] = []

    def __enter__(self) -> LockClient:
        stack = contextlib.ExitStack()
        try:
            if self.endpoint_url is None:
                try:
                    from moto import mock_aws
                except ImportError as exc:  # pragma: no cover - depends on the environment
                    raise ImportError(
                        "lock_table() without endpoint_url needs moto: pip install django-dynlock[testing]"
                    ) from exc
                stack.enter_context(mock_aws())
            from django.conf import settings

            table = f"dynlock-test-{uuid.uuid4().hex[:12]}"
            dynlock = dict(getattr(settings, "DYNLOCK", {}))
            dynlock[self.using] = _alias_settings(self.endpoint_url, table, self.overrides)
            dynlock.setdefault(DEFAULT_ALIAS, dynlock[self.using])
            if self.settings is None:
                stack.enter_context(override_settings(DYNLOCK=dynlock))
            else:  # e.g. pytest-django's settings fixture, which restores DYNLOCK itself
                self.settings.DYNLOCK = dynlock
            client = get_lock_client(self.using)
            client.create_table(wait=True)
            stack.callback(self._drop, client)
        except BaseException:
            stack.close()
            raise
        self._stack.append(stack)
        return client

    @staticmethod
    def _drop(client: LockClient) -> None:
        client.close()
        if client.options.endpoint_url is not None:
            with contextlib.suppress(Exception):
                LockClient(client.options).boto.delete_table(TableName=client.options.table_name)

    def __exit__(self, *exc_info: Any) -> None:
        self._stack.pop().close()


def dynlock_table_fixture() -> Iterator[LockClient]:
    with lock_table() as client:
        yield client
