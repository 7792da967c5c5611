from django.apps import AppConfig


class DynLockConfig(AppConfig):
    name = "django_dynlock"
    verbose_name = "DynamoDB locks"
    default_auto_field = "django.db.models.AutoField"

    def ready(self) -> None:
        # Importing registers the checks and the setting_changed receiver (both idempotent).
        from . import checks, conf  # noqa: F401
