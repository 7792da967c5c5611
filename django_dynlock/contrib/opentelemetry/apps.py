from django.apps import AppConfig

from . import DynlockInstrumentor


class OpenTelemetryConfig(AppConfig):
    """``"django_dynlock.contrib.opentelemetry"`` in INSTALLED_APPS: ``DynlockInstrumentor().instrument()`` at ready()."""

    name = "django_dynlock.contrib.opentelemetry"
    label = "dynlock_opentelemetry"
    verbose_name = "django-dynlock OpenTelemetry"

    def ready(self) -> None:
        DynlockInstrumentor().instrument()
