"""The URLconf of tests/test_observability.py's traced requests: one view locked by a
key template, waiting briefly, so that a held key shows its busy looks as span events."""

from __future__ import annotations

from django.http import JsonResponse
from django.urls import path

from django_dynlock import dynamo_lock


@dynamo_lock("report:{tenant}", wait=0.6)
def report(request, tenant):
    return JsonResponse({"token": dynamo_lock.current().token})


urlpatterns = [path("report/<str:tenant>/", report)]
