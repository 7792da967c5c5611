"""The demo: the last seats of an event, booked by many people at once."""

from __future__ import annotations

import time

from django.db import models

from django_dynlock import dynamo_lock
from django_dynlock.fencing import FencedQuerySet, FencingTokenField


class SoldOut(Exception):
    pass


class Event(models.Model):
    name = models.CharField(max_length=100)
    seats_left = models.PositiveIntegerField()
    # The highest fencing token that changed this row: a holder paused past its
    # lease cannot write after a newer holder did.
    fence = FencingTokenField()

    objects = FencedQuerySet.as_manager()

    def __str__(self) -> str:
        return self.name

    @dynamo_lock("event:{self.pk}", wait=10, reentrant=True)
    def book_seat(self, name: str, think: float = 0.0) -> Booking:
        """Read, think, write: unsafe without the lock, because each step is separate."""
        lease = dynamo_lock.current()
        event = Event.objects.get(pk=self.pk)  # a fresh read under the lock
        if event.seats_left == 0:
            raise SoldOut(event.name)
        time.sleep(think)  # e.g. a payment call: wide open to a concurrent booking
        if not Event.objects.filter(pk=self.pk).fenced_update(lease.token, seats_left=event.seats_left - 1):
            raise RuntimeError("a newer lock holder has written this event")
        return Booking.objects.create(event=event, name=name, token=lease.token)

    def book_seat_unlocked(self, name: str, think: float = 0.0) -> Booking:
        """The same steps without a lock, for the demo's comparison."""
        event = Event.objects.get(pk=self.pk)
        if event.seats_left == 0:
            raise SoldOut(event.name)
        time.sleep(think)
        Event.objects.filter(pk=self.pk).update(seats_left=event.seats_left - 1)
        return Booking.objects.create(event=event, name=name, token=0)


class Booking(models.Model):
    event = models.ForeignKey(Event, on_delete=models.CASCADE, related_name="bookings")
    name = models.CharField(max_length=100)
    token = models.PositiveBigIntegerField()
    created = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.name} @ {self.event}"
