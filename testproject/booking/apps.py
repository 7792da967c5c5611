from django.apps import AppConfig


class BookingConfig(AppConfig):
    name = "testproject.booking"
    label = "booking"
    default_auto_field = "django.db.models.BigAutoField"
