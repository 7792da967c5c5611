"""Building the low-level boto3 client a LockClient talks through.

Low-level clients are thread-safe; boto3 sessions and resources are not, and
creating clients from one session concurrently can race inside botocore. So each
client is built from its own explicit Session, under a lock.

The sessions share one botocore loader, the part that reads and parses DynamoDB's
service model (JSON) and keeps it: a session of its own parsed it again for every
client, 70 ms of CPU each where a client now costs 10 ms. Credentials, profile and
region stay each session's own.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import boto3
import botocore.loaders
import botocore.session

from ..exceptions import CredentialsError
from .options import ClientOptions, half_key_pair, without_botocore_retries

_build_lock = threading.Lock()
_loader: Any = None  # the shared botocore loader, made on first use


def _reset_after_fork() -> None:
    # Another thread may have held the lock at fork time; the child has no such thread.
    global _build_lock
    _build_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


def build_boto_client(options: ClientOptions) -> Any:
    half_pair = half_key_pair(options.session_options)
    if half_pair:
        given, missing = half_pair
        raise CredentialsError(f"SESSION_OPTIONS has {given} but no {missing}: give both, or neither")
    global _loader
    with _build_lock:
        if _loader is None:
            _loader = botocore.loaders.create_loader()
        core = botocore.session.get_session()
        core.register_component("data_loader", _loader)
        session = boto3.session.Session(botocore_session=core, **options.session_options)
        # boto3 adds its own data folder to the loader's search path for every session.
        _loader.search_paths[:] = list(dict.fromkeys(_loader.search_paths))
        return session.client(
            "dynamodb",
            endpoint_url=options.endpoint_url,
            region_name=options.region_name,
            config=without_botocore_retries(options.client_config),
        )
