"""Each request row records the transaction that last wrote it, so the tick's snapshot
reads only the rows written since its last read (`portal.tick.snapshot`).

PostgreSQL only: a trigger sets `changed_xact` on every insert and update, whatever
wrote the row (the ORM, a bulk COPY, a hand-typed UPDATE), except an update made while
the transaction's `portal.untracked_write` setting is on: the tick's own write of the
waiting requests' status (`bulk_set(..., untracked=True)`), which the tick's kept rows
already hold. SQLite's tick reads every pending row, as before. The column is not on the
model: nothing but the snapshot reads it.
"""

from django.db import migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps

PG = """
ALTER TABLE portal_gpurequest ADD COLUMN changed_xact xid8 NOT NULL DEFAULT pg_current_xact_id();
CREATE OR REPLACE FUNCTION portal_gpurequest_changed() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND current_setting('portal.untracked_write', true) = 'on' THEN
        RETURN NEW;
    END IF;
    NEW.changed_xact := pg_current_xact_id();
    RETURN NEW;
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER portal_gpurequest_changed BEFORE INSERT OR UPDATE ON portal_gpurequest
    FOR EACH ROW EXECUTE FUNCTION portal_gpurequest_changed();
CREATE INDEX portal_gpurequest_changed_xact ON portal_gpurequest (changed_xact);
"""
PG_REVERSE = """
DROP TRIGGER IF EXISTS portal_gpurequest_changed ON portal_gpurequest;
DROP FUNCTION IF EXISTS portal_gpurequest_changed();
ALTER TABLE portal_gpurequest DROP COLUMN IF EXISTS changed_xact;
"""


def forwards(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PG)


def backwards(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PG_REVERSE)


class Migration(migrations.Migration):
    dependencies = [("portal", "0031_profile_overload_queue_ratio")]
    operations = [migrations.RunPython(forwards, backwards)]
