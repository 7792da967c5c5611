from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class DynLockConfig(AppConfig):
    name = "django_dynlock"
    verbose_name = _("DynamoDB locks")
    default_auto_field = "django.db.models.AutoField"

    def ready(self) -> None:
        # Importing registers the checks and the setting_changed receiver (both idempotent).
        from . import checks, registry  # noqa: F401
