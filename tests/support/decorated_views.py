"""Views decorated in every shape the docs promise, for tests/test_decorator.py."""

from __future__ import annotations

from django.http import HttpResponse, JsonResponse
from django.urls import path
from django.utils.decorators import method_decorator
from django.views import View

from django_dynlock import dynamo_lock
from django_dynlock.exceptions import BackendError


def _current() -> dict:
    lease = dynamo_lock.current()
    return {"key": lease.key, "token": lease.token, "holder": lease.holder}


@dynamo_lock("order:{order_id}")
def pay(request, order_id):
    return JsonResponse(_current())


@dynamo_lock("order:{order_id}")
async def pay_async(request, order_id):
    return JsonResponse(_current())


@dynamo_lock("order:{order_id}", "stock:{order_id}")
def pay_many(request, order_id):
    return HttpResponse("paid")


@dynamo_lock("order:{order_id}", "stock:{order_id}")
async def pay_many_async(request, order_id):
    return HttpResponse("paid")


@dynamo_lock("order:{order_id}", on_busy=409)
def pay_409(request, order_id):
    return JsonResponse(_current())


@dynamo_lock("order:{order_id}", on_busy=lambda request, error: HttpResponse(f"busy {error.key}", status=503))
def pay_custom(request, order_id):
    return JsonResponse(_current())


class ShipView(View):
    @method_decorator(dynamo_lock("order:{order_id}", wait=2))
    def post(self, request, order_id):
        return JsonResponse(_current())


@method_decorator(dynamo_lock("order:{order_id}"), name="dispatch")
class CancelView(View):
    def post(self, request, order_id):
        return JsonResponse(_current())


@dynamo_lock(lambda request, **kw: f"cart:{request.GET['user']}")
async def checkout(request):
    return JsonResponse(_current())


@dynamo_lock("order:{order_id}", on_error="raise")
def pay_raise(request, order_id):
    return JsonResponse(_current())


@dynamo_lock("order:{order_id}", on_error=lambda request, error: HttpResponse(f"trouble {error.code}", status=502))
def pay_error_custom(request, order_id):
    return JsonResponse(_current())


@dynamo_lock("order:{order_id}")
def own_backend_error(request, order_id):
    # The view's own failure, after the lock was granted: never a 503.
    raise BackendError("the view's own DynamoDB call failed", code="ThrottlingException", retryable=True)


@dynamo_lock("order:{order_id}")
async def own_backend_error_async(request, order_id):
    raise BackendError("the view's own DynamoDB call failed", code="ThrottlingException", retryable=True)


urlpatterns = [
    path("pay/<int:order_id>/", pay),
    path("payasync/<int:order_id>/", pay_async),
    path("paymany/<int:order_id>/", pay_many),
    path("paymanyasync/<int:order_id>/", pay_many_async),
    path("pay409/<int:order_id>/", pay_409),
    path("paycustom/<int:order_id>/", pay_custom),
    path("ship/<int:order_id>/", ShipView.as_view()),
    path("cancel/<int:order_id>/", CancelView.as_view()),
    path("checkout/", checkout),
    path("payraise/<int:order_id>/", pay_raise),
    path("payerror/<int:order_id>/", pay_error_custom),
    path("own/<int:order_id>/", own_backend_error),
    path("ownasync/<int:order_id>/", own_backend_error_async),
]
