from django.db import migrations, models
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps


def keep_append_only(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    # SQLite adds a column with a default by rebuilding the table, which drops the
    # append-only trigger of 0002; put it back (PostgreSQL keeps its trigger).
    if schema_editor.connection.vendor == "sqlite":
        schema_editor.execute(
            """CREATE TRIGGER IF NOT EXISTS portal_auditevent_no_update
               BEFORE UPDATE ON portal_auditevent
               BEGIN SELECT RAISE(ABORT, 'audit events are append-only'); END;"""
        )


class Migration(migrations.Migration):
    dependencies = [
        ("portal", "0015_lifecycle"),
    ]

    operations = [
        migrations.AddField(
            model_name="auditevent",
            name="reason",
            field=models.CharField(blank=True, default="", max_length=500),
        ),
        migrations.RunPython(keep_append_only, migrations.RunPython.noop),
    ]
