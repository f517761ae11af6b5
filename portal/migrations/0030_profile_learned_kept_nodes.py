"""Profiles stored before `learned_kept_nodes` existed get it, at the shipped value
(versioned and audited: see `_profile_knobs`)."""

from django.db import migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps

from portal.migrations._profile_knobs import add_knobs


def forwards(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    add_knobs(apps, {"learned_kept_nodes": 1})


class Migration(migrations.Migration):
    dependencies = [("portal", "0029_burn_in_gate")]

    operations = [migrations.RunPython(forwards, migrations.RunPython.noop)]
