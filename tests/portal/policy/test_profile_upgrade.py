"""A profile stored before a knob existed gets it on upgrade, versioned and audited."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.db.migrations.loader import MigrationLoader

from portal.models import AuditEvent, PolicyProfile, PolicyVersion

pytestmark = pytest.mark.django_db(transaction=True)

#: (the migration before, the migration that adds the knob, the knob, its shipped value)
UPGRADES = [
    ("0018_write_indexes", "0019_profile_starving_loss_ratio", "starving_loss_ratio", 1.0),
    (
        "0020_decision_log_without_fk_constraints",
        "0021_profile_victim_loss_per_gpu",
        "victim_loss_per_gpu_s",
        900,
    ),
    ("0029_burn_in_gate", "0030_profile_learned_kept_nodes", "learned_kept_nodes", 1),
    (
        "0030_profile_learned_kept_nodes",
        "0031_profile_overload_queue_ratio",
        "overload_queue_ratio",
        0.5,
    ),
]


def _migrate(targets: list[tuple[str, str | None]]) -> None:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)


@pytest.fixture
def back_to_latest() -> Iterator[None]:
    yield
    _migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())


@pytest.mark.parametrize(("before", "after", "knob", "value"), UPGRADES)
def test_a_stored_profile_without_the_new_knob_gets_it_with_a_new_version(
    back_to_latest: None, before: str, after: str, knob: str, value: object
) -> None:
    _migrate([("portal", before)])
    try:
        old = MigrationLoader(connection).project_state(("portal", before)).apps
        knobs = {"packer": "fgd-bestfit", "starvation_after": 1.0}
        row = old.get_model("portal", "PolicyProfile").objects.create(
            name="ours", version=3, knobs=knobs
        )
        current = old.get_model("portal", "PolicyProfile").objects.create(
            name="newer", version=2, knobs={**knobs, knob: 7}
        )
    finally:
        _migrate([("portal", after)])
    upgraded = PolicyProfile.objects.get(pk=row.pk)
    assert upgraded.version == 4
    assert upgraded.knobs == {**knobs, knob: value}
    assert getattr(upgraded.profile().policy(), knob) == value
    untouched = PolicyProfile.objects.get(pk=current.pk)
    assert (untouched.version, untouched.knobs[knob]) == (2, 7)
    event = AuditEvent.objects.get(action="profile.update", object_id=str(row.pk))
    assert event.actor_name == "upgrade"
    assert event.before == {"version": 3, knob: None}
    assert event.after == {"version": 4, knob: value}
    assert PolicyVersion.objects.filter(object_id=str(row.pk), action="profile.update").count() == 1
    assert not AuditEvent.objects.filter(object_id=str(current.pk)).exists()
