from django.urls import path

from . import views

app_name = "booking"
urlpatterns = [
    path("events/<int:event_id>/", views.event_page, name="event"),
    path("events/<int:event_id>/book/", views.book_view, name="book"),
    path("events/<int:event_id>/book-unlocked/", views.book_unlocked_view, name="book-unlocked"),
    path("events/<int:event_id>/reset/", views.reset_view, name="reset"),
    path("events/<int:event_id>/status/", views.status_view, name="status"),
]
