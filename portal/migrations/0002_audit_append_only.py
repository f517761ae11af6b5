"""Make audit events append-only in the database itself, not only in Python.

PostgreSQL refuses UPDATE and DELETE (TRUNCATE, an operator's tool, stays
possible). SQLite refuses UPDATE; a DELETE trigger there would also block
`flush`, which SQLite implements with DELETE, so deletes are refused in Python.
"""

from django.db import migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps

PG = """
CREATE OR REPLACE FUNCTION portal_auditevent_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'audit events are append-only';
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER portal_auditevent_no_update BEFORE UPDATE OR DELETE ON portal_auditevent
    FOR EACH ROW EXECUTE FUNCTION portal_auditevent_append_only();
"""
PG_REVERSE = """
DROP TRIGGER IF EXISTS portal_auditevent_no_update ON portal_auditevent;
DROP FUNCTION IF EXISTS portal_auditevent_append_only();
"""
SQLITE = [
    """CREATE TRIGGER portal_auditevent_no_update BEFORE UPDATE ON portal_auditevent
       BEGIN SELECT RAISE(ABORT, 'audit events are append-only'); END;""",
]


def forwards(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PG)
    elif schema_editor.connection.vendor == "sqlite":
        for statement in SQLITE:
            schema_editor.execute(statement)


def backwards(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PG_REVERSE)
    elif schema_editor.connection.vendor == "sqlite":
        schema_editor.execute("DROP TRIGGER IF EXISTS portal_auditevent_no_update")
        schema_editor.execute("DROP TRIGGER IF EXISTS portal_auditevent_no_delete")


class Migration(migrations.Migration):
    dependencies = [("portal", "0001_initial")]
    operations = [migrations.RunPython(forwards, backwards)]
