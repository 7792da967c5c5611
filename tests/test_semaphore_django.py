"""Semaphores in the Django layer (issue 38 step 3): dynamo_lock(limit=...), per tenant."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from django_dynlock import InvalidArgument, LockNotAcquired, SemaphoreConflict, dynamo_lock

TENANT_LIMITS = {"acme": 2, "globex": 5}


def test_a_decorated_function_with_a_limit_per_tenant(dynlock):
    """Tenants with limits 2 and 5 at the same time: a limit callable given the call's
    ``tenant_id`` by name, as the key template is."""
    release = threading.Event()
    lock = threading.Lock()
    holding: dict[str, int] = {"acme": 0, "globex": 0}
    most: dict[str, int] = {"acme": 0, "globex": 0}
    answered: list[str] = []

    @dynamo_lock("export:{tenant_id}", limit=lambda tenant_id: TENANT_LIMITS[tenant_id], wait=0, on_busy="skip")
    def export(request, tenant_id, *, fmt="csv"):
        with lock:
            holding[tenant_id] += 1
            most[tenant_id] = max(most[tenant_id], holding[tenant_id])
            answered.append(tenant_id)
        release.wait(20)
        with lock:
            holding[tenant_id] -= 1
        return tenant_id

    results: list[str | None] = []
    threads = [
        threading.Thread(target=lambda t=tenant: results.append(export(None, tenant_id=t)))
        for tenant in ("acme", "globex")
        for _ in range(7)
    ]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + 20
    while len(answered) + len(results) < len(threads) and time.monotonic() < deadline:
        time.sleep(0.02)
    release.set()
    for thread in threads:
        thread.join(20)
    assert most == {"acme": 2, "globex": 5}
    assert sorted(r for r in results if r) == ["acme"] * 2 + ["globex"] * 5
    assert results.count(None) == 14 - 7
    assert dynlock.semaphore_limit("export:acme") == 2 and dynlock.semaphore_limit("export:globex") == 5


def test_an_async_view_and_a_with_block(dynlock):
    @dynamo_lock("report", limit=2, wait=0)
    async def report():
        return dynamo_lock.current().slot

    async def main():
        async with dynamo_lock("report", limit=2) as held:
            slots = {held.slot, await report()}
        return slots

    assert asyncio.run(main()) == {0, 1}
    with dynamo_lock("report", limit=2) as first, dynamo_lock("report", limit=2) as second:
        assert {first.slot, second.slot} == {0, 1}
        with pytest.raises(LockNotAcquired), dynamo_lock("report", limit=2, wait=0):
            pass
    with pytest.raises(SemaphoreConflict), dynamo_lock("report", limit=3, wait=0):
        pass


def test_limits_are_checked_when_decorating():
    with pytest.raises(InvalidArgument, match="needs 'tenant'"):
        dynamo_lock("export:{tenant_id}", limit=lambda tenant: 2)(lambda request, tenant_id: None)
    with pytest.raises(InvalidArgument, match="an int or a callable"):
        dynamo_lock("export", limit="5")
    with pytest.raises(InvalidArgument, match="one key"):
        dynamo_lock("a", "b", limit=2)
    with pytest.raises(InvalidArgument, match="with block"), dynamo_lock("a", limit=lambda: 2):
        pass


def test_a_limit_callable_that_returns_no_limit_fails_the_call(dynlock):
    @dynamo_lock("export:{tenant_id}", limit=lambda tenant_id: None)
    def export(tenant_id):
        return tenant_id

    with pytest.raises(InvalidArgument, match="got None"):
        export("acme")


def test_a_limit_above_99_is_a_system_check_error(monkeypatch, dynlock):
    """dynlock.E017, as a model field's bad option: reported by ``manage.py check``, and
    refused by each call before any request."""
    from django.core import checks

    from django_dynlock import keytemplates

    monkeypatch.setattr(keytemplates, "declared_limits", [])

    @dynamo_lock("export", limit=100)
    def export():
        return "ran"

    errors = [m for m in checks.run_checks(tags=["dynlock"]) if m.id == "dynlock.E017"]
    assert len(errors) == 1 and errors[0].obj == f"{__name__}.{export.__qualname__}"
    assert "limit=100" in errors[0].msg and "BatchGetItem" in errors[0].hint
    with pytest.raises(InvalidArgument, match="from 1 to 99"):
        export()
    monkeypatch.setattr(keytemplates, "declared_limits", [])
    assert not [m for m in checks.run_checks(tags=["dynlock"]) if m.id == "dynlock.E017"]
