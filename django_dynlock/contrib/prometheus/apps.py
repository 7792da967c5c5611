from django.apps import AppConfig

from . import install


class PrometheusConfig(AppConfig):
    """``"django_dynlock.contrib.prometheus"`` in INSTALLED_APPS: the metrics, at ready()."""

    name = "django_dynlock.contrib.prometheus"
    label = "dynlock_prometheus"
    verbose_name = "django-dynlock Prometheus metrics"

    def ready(self) -> None:
        install()
