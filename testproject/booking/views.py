from __future__ import annotations

import datetime as dt
from typing import Any
from urllib.parse import urlencode

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from django_dynlock import DynLockError, dynamo_lock, get_lock_client

from .models import Event, SoldOut
from .services import book

# The page's choices for the payment call's duration (seconds). The longest keeps a run's
# five bookings (5 s under the lock) inside the views' wait=10, so no booking gives up.
THINK_CHOICES = {"0.02": "20 ms", "0.2": "200 ms", "1": "1 s"}
MAX_THINK = 1.0


def lock_key(event_id: int) -> str:
    return f"event:{event_id}"  # what the views' "event:{event_id}" makes of it


def admin_url(key: str) -> str:
    """The admin's list of leases, on this key, refreshing every second."""
    return reverse("admin:django_dynlock_lease_changelist") + "?" + urlencode({"q": key, "refresh": 1})


def event_page(request: HttpRequest, event_id: int) -> HttpResponse:
    event = get_object_or_404(Event, pk=event_id)
    key = lock_key(event.pk)
    context = {"event": event, "key": key, "admin_url": admin_url(key), "think_choices": THINK_CHOICES}
    return render(request, "booking/event.html", context)


def think_time(request: HttpRequest) -> float | None:
    """The posted ``think`` in seconds (20 ms if absent), or None when it is not one we accept."""
    try:
        think = float(request.POST.get("think", 0.02))
    except ValueError:
        return None
    return think if 0 <= think <= MAX_THINK else None


def bad_think() -> JsonResponse:
    return JsonResponse(
        {"booked": False, "reason": f"think must be a number of seconds from 0 to {MAX_THINK}"}, status=400
    )


@csrf_exempt  # the demo page fires plain fetch() calls
@require_POST
@dynamo_lock("event:{event_id}", wait=10, reentrant=True)
def book_view(request: HttpRequest, event_id: int) -> HttpResponse:
    think = think_time(request)
    if think is None:
        return bad_think()
    try:
        booking = book(event_id, request.POST.get("name", "guest"), think=think)
    except SoldOut:
        return JsonResponse({"booked": False, "reason": "sold out"}, status=409)
    return JsonResponse({"booked": True, "token": booking.token})


@csrf_exempt
@require_POST
def book_unlocked_view(request: HttpRequest, event_id: int) -> HttpResponse:
    event = get_object_or_404(Event, pk=event_id)
    think = think_time(request)
    if think is None:
        return bad_think()
    try:
        event.book_seat_unlocked(request.POST.get("name", "guest"), think=think)
    except SoldOut:
        return JsonResponse({"booked": False, "reason": "sold out"}, status=409)
    return JsonResponse({"booked": True})


@csrf_exempt
@require_POST
def reset_view(request: HttpRequest, event_id: int) -> HttpResponse:
    event = get_object_or_404(Event, pk=event_id)
    event.bookings.all().delete()
    Event.objects.filter(pk=event_id).update(seats_left=int(request.POST.get("seats", 5)))
    return JsonResponse({"seats_left": Event.objects.get(pk=event_id).seats_left})


def lock_status(key: str) -> dict[str, Any]:
    """Who holds ``key`` now, for the page's indicator: one consistent read.

    Times are DynamoDB's clock as the lock client estimates it, like the lease's own.
    The token is a string: a JavaScript number is exact only up to 2**53.
    """
    status: dict[str, Any] = {"key": key, "held": False, "admin_url": admin_url(key)}
    try:
        client = get_lock_client()
        info = client.get(key)
        now = client.server_datetime()
    except DynLockError as exc:  # the page says so and keeps polling
        return {**status, "error": str(exc)}

    def iso(when: dt.datetime | None) -> str | None:
        return when.isoformat(timespec="milliseconds") if when else None

    status["now"] = iso(now)
    if info is None:
        return status
    held_for = (now - info.acquired_at).total_seconds() if info.acquired_at else None
    return {
        **status,
        "held": True,
        "holder": info.describe(user=True),
        "token": str(info.token),
        "acquired_at": iso(info.acquired_at),
        "expires_at": iso(info.expires_at),
        "held_for": None if held_for is None else max(0.0, held_for),
        "expires_in": info.expires_in(now),
        "lease_seconds": info.lease_seconds,
    }


def status_view(request: HttpRequest, event_id: int) -> HttpResponse:
    """The page polls this during a run: the seats, the bookings and the lock's holder."""
    event = get_object_or_404(Event, pk=event_id)
    return JsonResponse(
        {"seats_left": event.seats_left, "bookings": event.bookings.count(), "lock": lock_status(lock_key(event.pk))}
    )
