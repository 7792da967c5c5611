from django.db import migrations


def create_event(apps, schema_editor):
    Event = apps.get_model("booking", "Event")
    Event.objects.get_or_create(pk=1, defaults={"name": "The last five seats", "seats_left": 5})


class Migration(migrations.Migration):
    dependencies = [("booking", "0001_initial")]
    operations = [migrations.RunPython(create_event, migrations.RunPython.noop)]
