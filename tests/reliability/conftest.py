"""The reliability suite's marker: ``soak`` scenarios run only with DYNLOCK_SOAK=1.

    DYNLOCK_SOAK=1 .venv/bin/python -m pytest tests/reliability -m soak

The default run (``make test``) keeps the suite's time budget: the soak versions of
the scenarios run longer windows for tighter figures.
"""

from __future__ import annotations

import os

import pytest

SOAK = os.environ.get("DYNLOCK_SOAK") == "1"


def pytest_configure(config):
    config.addinivalue_line("markers", "soak: long reliability scenario; runs only with DYNLOCK_SOAK=1")


def pytest_collection_modifyitems(config, items):
    if SOAK:
        return
    skip = pytest.mark.skip(reason="soak scenario: set DYNLOCK_SOAK=1 to run it")
    for item in items:
        if "soak" in item.keywords:
            item.add_marker(skip)
