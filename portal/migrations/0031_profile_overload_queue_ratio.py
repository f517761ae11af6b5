"""Profiles stored before `overload_queue_ratio` existed get it, at the shipped value
(versioned and audited: see `_profile_knobs`)."""

from django.db import migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps

from portal.migrations._profile_knobs import add_knobs


def forwards(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    add_knobs(apps, {"overload_queue_ratio": 0.5})


class Migration(migrations.Migration):
    dependencies = [("portal", "0030_profile_learned_kept_nodes")]

    operations = [migrations.RunPython(forwards, migrations.RunPython.noop)]
