"""pytest plugin (registered through the ``pytest11`` entry point).

``dynlock_table``: a fresh lock table on moto's in-process DynamoDB for one test;
the ``default`` alias points at it. Yields the LockClient.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture
def dynlock_table() -> Iterator[Any]:
    from . import dynlock_table_fixture

    yield from dynlock_table_fixture()
