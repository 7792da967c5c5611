from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, render
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from django_dynlock import dynamo_lock

from .models import Event, SoldOut
from .services import book


def event_page(request: HttpRequest, event_id: int) -> HttpResponse:
    event = get_object_or_404(Event, pk=event_id)
    return render(request, "booking/event.html", {"event": event})


@csrf_exempt  # the demo page fires plain fetch() calls
@require_POST
@dynamo_lock("event:{event_id}", wait=10, reentrant=True)
def book_view(request: HttpRequest, event_id: int) -> HttpResponse:
    try:
        booking = book(event_id, request.POST.get("name", "guest"), think=float(request.POST.get("think", 0.02)))
    except SoldOut:
        return JsonResponse({"booked": False, "reason": "sold out"}, status=409)
    return JsonResponse({"booked": True, "token": booking.token})


@csrf_exempt
@require_POST
def book_unlocked_view(request: HttpRequest, event_id: int) -> HttpResponse:
    event = get_object_or_404(Event, pk=event_id)
    try:
        event.book_seat_unlocked(request.POST.get("name", "guest"), think=float(request.POST.get("think", 0.02)))
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


def status_view(request: HttpRequest, event_id: int) -> HttpResponse:
    event = get_object_or_404(Event, pk=event_id)
    return JsonResponse({"seats_left": event.seats_left, "bookings": event.bookings.count()})
