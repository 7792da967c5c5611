"""A service function guarded by the same key as the model method it calls."""

from __future__ import annotations

from django_dynlock import dynamo_lock

from .models import Booking, Event


@dynamo_lock("event:{event_id}", wait=10, reentrant=True)
def book(event_id: int, name: str, think: float = 0.0) -> Booking:
    # Re-entrant: Event.book_seat locks the same key in this thread without a second write.
    return Event.objects.get(pk=event_id).book_seat(name, think=think)
