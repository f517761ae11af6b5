"""A profile stored before a knob existed gets it on upgrade, versioned and audited."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from portal.models import AuditEvent, PolicyProfile, PolicyVersion

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = [("portal", "0018_write_indexes")]
AFTER = [("portal", "0019_profile_starving_loss_ratio")]


def _migrate(targets: list[tuple[str, str]]) -> None:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)


def test_a_stored_profile_without_the_new_knob_gets_it_with_a_new_version() -> None:
    _migrate(BEFORE)
    try:
        from django.db.migrations.loader import MigrationLoader

        old = MigrationLoader(connection).project_state(BEFORE[0]).apps
        knobs = {"packer": "fgd-bestfit", "starvation_after": 1.0}
        row = old.get_model("portal", "PolicyProfile").objects.create(
            name="ours", version=3, knobs=knobs
        )
        current = old.get_model("portal", "PolicyProfile").objects.create(
            name="newer", version=2, knobs={**knobs, "starving_loss_ratio": 0.5}
        )
    finally:
        _migrate(AFTER)
    upgraded = PolicyProfile.objects.get(pk=row.pk)
    assert upgraded.version == 4
    assert upgraded.knobs == {**knobs, "starving_loss_ratio": 1.0}
    assert upgraded.profile().policy().starving_loss_ratio == 1.0
    untouched = PolicyProfile.objects.get(pk=current.pk)
    assert (untouched.version, untouched.knobs["starving_loss_ratio"]) == (2, 0.5)
    event = AuditEvent.objects.get(action="profile.update", object_id=str(row.pk))
    assert event.actor_name == "upgrade"
    assert event.before == {"version": 3, "starving_loss_ratio": None}
    assert event.after == {"version": 4, "starving_loss_ratio": 1.0}
    assert PolicyVersion.objects.filter(object_id=str(row.pk), action="profile.update").count() == 1
    assert not AuditEvent.objects.filter(object_id=str(current.pk)).exists()
