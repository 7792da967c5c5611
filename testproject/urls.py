"""URLs for the django-dynlock demo project."""

from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView

urlpatterns = [
    path("admin/", admin.site.urls),
    path("demo/", include("testproject.booking.urls")),
    path("", RedirectView.as_view(url="/admin/", permanent=False)),
]
