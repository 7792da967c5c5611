"""A release that could not reach DynamoDB goes on in the background; when it finally gets
through and finds the lease taken over or broken, the holder is told (issue 29): the
``lock_lost`` signal and a WARNING, as docs/protocol.md promises. Before, the retry
stopped without a word."""

from __future__ import annotations

import logging

import pytest

from django_dynlock import get_lock_client
from django_dynlock.signals import lock_lost
from localdynamo.faultproxy import FaultProxy
from tests.support.polling import wait_for


@pytest.mark.parametrize("ending", ["taken", "broken"])
def test_a_background_release_that_finds_the_lease_ended_tells_the_holder(dynlock, settings, caplog, ending):
    heard: list[tuple[str, int]] = []

    def on_lost(sender, lease, reason, **_):
        heard.append((reason, lease.token))

    lock_lost.connect(on_lost)
    try:
        with FaultProxy(dynlock.server.endpoint_url, max_seconds=60) as link:
            settings.DYNLOCK = {"default": {**settings.DYNLOCK["default"], "ENDPOINT_URL": link.endpoint_url}}
            holder = get_lock_client()
            lease = holder.acquire("k", lease=1.5)
            link.pause()  # the holder's link is down: its release goes on in the background
            lease.release()
            if ending == "taken":
                later = dynlock.acquire("k", wait=10)  # once its expiry passes
            else:
                assert dynlock.break_lease("k", token=lease.token, reason="test")
            link.resume()
            wait_for(lambda: heard, 15, "lock_lost from the background release")
    finally:
        lock_lost.disconnect(on_lost)
    assert heard == [(ending, lease.token)]
    warnings = [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and "before its release" in r.getMessage()
    ]
    assert len(warnings) == 1 and ending in warnings[0], warnings
    if ending == "taken":
        assert later.is_held and dynlock.get("k").owner == later.owner  # the retry left the new holder alone
        later.release()
