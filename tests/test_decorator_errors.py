"""A decorated view whose DynamoDB is throttled, failing or unreachable answers 503 (on_error).

Real servers behind the fault proxy; the default alias goes through the proxy, the test's
own client (``dynlock``) straight to the server.
"""

from __future__ import annotations

import asyncio
import logging

import pytest
from django.test import AsyncClient

from django_dynlock import InvalidArgument, dynamo_lock
from django_dynlock.exceptions import BackendError, TableNotFound
from localdynamo.faultproxy import FaultProxy
from tests.support.polling import wait_for

pytestmark = pytest.mark.urls("tests.support.decorated_views")


@pytest.fixture
def proxy(dynlock, settings):
    with FaultProxy(dynlock.server.endpoint_url, max_seconds=60) as proxy:
        settings.DYNLOCK = {"default": {**settings.DYNLOCK["default"], "ENDPOINT_URL": proxy.endpoint_url}}
        yield proxy


def trouble(proxy: FaultProxy, kind: str) -> None:
    if kind == "paused":
        proxy.pause()
    else:
        proxy.set_rates({kind: 1.0})


TROUBLES = [("throttle", "1"), ("http500", "5"), ("paused", "5")]


@pytest.mark.django_db
@pytest.mark.parametrize(("kind", "retry_after"), TROUBLES)
def test_a_view_answers_503_with_retry_after_and_a_log_line_when_dynamodb_is_in_trouble(
    proxy, client, caplog, kind, retry_after
):
    assert client.get("/pay/1/").status_code == 200  # through the proxy, before the trouble
    trouble(proxy, kind)
    with caplog.at_level(logging.WARNING, logger="django_dynlock"):
        reply = client.get("/pay/1/")
    assert reply.status_code == 503 and reply["Retry-After"] == retry_after
    logged = [r for r in caplog.records if r.name == "django_dynlock" and "answered 503" in r.getMessage()]
    assert len(logged) == 1 and "tests.support.decorated_views.pay" in logged[0].getMessage()
    # Class-based, on a method and on dispatch, alike.
    assert client.post("/ship/2/").status_code == 503
    assert client.post("/cancel/3/").status_code == 503
    proxy.resume()
    proxy.set_rates({})
    assert client.get("/pay/1/").status_code == 200


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("kind", "retry_after"), TROUBLES)
def test_an_async_view_answers_503_too(proxy, kind, retry_after):
    trouble(proxy, kind)

    async def run():
        return await AsyncClient().get("/checkout/", {"user": "4"})

    reply = asyncio.run(run())
    assert reply.status_code == 503 and reply["Retry-After"] == retry_after


@pytest.mark.django_db
def test_on_error_raise_and_a_callable(proxy, client):
    proxy.set_rates({"throttle": 1.0})
    with pytest.raises(BackendError) as raised:
        client.get("/payraise/5/")
    assert raised.value.retryable and raised.value.code == "ProvisionedThroughputExceededException"
    reply = client.get("/payerror/5/")
    assert reply.status_code == 502 and reply.content == b"trouble ProvisionedThroughputExceededException"


@pytest.mark.django_db(transaction=True)
def test_the_views_own_backend_error_is_never_a_503(proxy, client):
    # A healthy DynamoDB: the lock is granted, then the view itself raises.
    with pytest.raises(BackendError, match="the view's own"):
        client.get("/own/6/")

    async def run():
        return await AsyncClient().get("/ownasync/7/")

    with pytest.raises(BackendError, match="the view's own"):
        asyncio.run(run())
    assert proxy.stats.faults == {}


@pytest.mark.django_db
def test_an_error_no_wait_can_fix_raises(dynlock, client, settings):
    # A missing table is a deployment bug: Django's 500 reports it, a 503 would hide it.
    settings.DYNLOCK = {"default": {**settings.DYNLOCK["default"], "TABLE_NAME": "dynlock-test-no-such-table"}}
    with pytest.raises(TableNotFound):
        client.get("/pay/8/")


def test_a_service_function_raises_by_default(proxy):
    @dynamo_lock("svc")
    def service():
        return "ran"

    proxy.set_rates({"http500": 1.0})
    with pytest.raises(BackendError) as raised:
        service()
    assert raised.value.retryable

    @dynamo_lock("svc", on_error=lambda request, error: ("skipped", request, error.code))
    def tolerant():
        return "ran"

    assert tolerant() == ("skipped", None, "InternalServerError")


@pytest.mark.parametrize("value", ["skip", "503", 200, 600, True, 503.0])
def test_a_wrong_on_error_is_refused(value):
    with pytest.raises(InvalidArgument, match="on_error must be 'raise', an HTTP status code"):
        dynamo_lock("k", on_error=value)


def test_on_error_is_for_decorators_only():
    with pytest.raises(InvalidArgument, match="on_error applies to decorated functions only"):
        with dynamo_lock("k", on_error=503):
            pass


@pytest.mark.django_db
def test_a_release_dynamodb_fails_still_answers_the_views_response(dynlock, proxy, client):
    # The view's work is done: its answer stands, and the release is retried in the background.
    def is_release(body):
        return "REMOVE #owner" in body.get("UpdateExpression", "")

    failed = proxy.add_fault("http500", operation="UpdateItem", match=is_release, times=1)
    reply = client.get("/pay/9/")
    assert reply.status_code == 200 and failed.fired == 1
    wait_for(lambda: dynlock.get("order:9") is None, 10, "the background release")
