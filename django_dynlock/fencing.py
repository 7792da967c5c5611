"""Fencing where the data lives: make a paused ex-holder's late write fail.

A lease's token is strictly greater than every token issued before for its key. A
row that remembers the highest token that wrote it can refuse a writer whose token
is lower: the holder that was paused (GC, SIGSTOP, a slow disk) past its lease and
wakes up believing it still holds the lock.

    class Invoice(models.Model):
        fence = FencingTokenField()

    applied = fenced_update(Invoice.objects.filter(pk=42), lease, status="paid")
"""

from __future__ import annotations

from typing import Any

from django.db import models

from .engine.lease import Lease

Token = int | Lease


def _token(value: Token) -> int:
    if isinstance(value, Lease):
        return value.token
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"a fencing token is an int or a Lease, got {value!r}")
    return value


class FencingTokenField(models.PositiveBigIntegerField):
    """The highest fencing token that has written this row (0: none yet)."""

    description = "Highest fencing token seen"

    def __init__(self, *args: Any, **kwargs: Any):
        kwargs.setdefault("default", 0)
        super().__init__(*args, **kwargs)


def fenced_update(queryset: models.QuerySet, token: Token, *, field: str = "fence", **updates: Any) -> bool:
    """One SQL UPDATE that applies only where the stored token is not above ``token``.

    Equal tokens pass, so one holder may write several times under its lease. Returns
    True if at least one row was updated; False means a newer holder has written.
    """
    value = _token(token)
    updated: int = queryset.filter(**{f"{field}__lte": value}).update(**{field: value}, **updates)
    return updated > 0


class FencedQuerySet(models.QuerySet):
    """A QuerySet with ``fenced_update``: ``objects = FencedQuerySet.as_manager()``."""

    def fenced_update(self, token: Token, *, field: str = "fence", **updates: Any) -> bool:
        return fenced_update(self, token, field=field, **updates)
