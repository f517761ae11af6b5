"""One shape builder: the form, the API, the preview and the tick agree."""

from __future__ import annotations

import pytest
from django.utils import timezone

from portal.lib import shapes
from portal.models import DeviceProfile, Pool, WorkloadClass
from portal.tick.snapshot import build_snapshot
from tests.base import make_world, submit


def test_normalize_keeps_what_each_kind_uses() -> None:
    assert shapes.normalize("whole", "3g.40gb", 250, 5120) == ("whole", "", 1000, 0)
    assert shapes.normalize("shared", "3g.40gb", 250, 5120) == ("shared", "", 250, 5120)
    assert shapes.normalize("mig", "3g.40gb", 250, 5120) == ("mig", "3g.40gb", 1000, 0)


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (("tpu",), "profile_kind"),
        (("shared", "", 0), "milli"),
        (("shared", "", 1000), "milli"),
        (("mig", ""), "mig_profile"),
    ],
)
def test_normalize_names_the_bad_field(args: tuple, field: str) -> None:
    with pytest.raises(shapes.ShapeError) as exc:
        shapes.normalize(*args)
    assert exc.value.field == field


def test_counts_are_bounded() -> None:
    shapes.check_counts(shapes.MAX_GPUS_PER_NODE, shapes.MAX_PODS)
    for count, pods, field in ((0, 1, "count"), (17, 1, "count"), (1, 0, "pods"), (1, 65, "pods")):
        with pytest.raises(shapes.ShapeError) as exc:
            shapes.check_counts(count, pods)
        assert exc.value.field == field


@pytest.mark.django_db
def test_a_submitted_request_is_the_same_shape_in_the_tick_as_in_the_preview() -> None:
    w = make_world()
    training = WorkloadClass.objects.get(name="training")
    for profile in DeviceProfile.objects.order_by("name"):
        pool = next(p for p in Pool.offering(None) if p.offers(profile.kind, profile.mig_profile))
        fields = {**shapes.profile_fields(profile), "count": 2}
        req = submit(w.bob, w.vision, workload_class=training, pool_name=pool.name, **fields)
        snapshot, _ = build_snapshot(timezone.now())
        in_tick = next(p.shape for p in snapshot.pending if p.id == str(req.pk))
        in_preview = shapes.shape_build(
            **fields,
            cpu_milli=req.cpu_milli,
            memory_mib=req.memory_mib,
            tolerations=shapes.tolerations([pool]),
        )
        assert in_tick == in_preview, profile.name
        assert req.gpus_milli == in_tick.gpus_milli


@pytest.mark.parametrize("profile_kind", ["whole", "shared", "mig"])
def test_a_serving_request_asks_the_core_to_spread_its_replicas(profile_kind: str) -> None:
    # The request's kind (serving or batch) is not its device profile's kind (whole, shared, mig):
    # a serving shape must keep the `spread` placement whatever device it asks for.
    mig = "1g.10gb" if profile_kind == "mig" else ""
    serving = shapes.shape_build(profile_kind=profile_kind, mig_profile=mig, kind="serving")
    batch = shapes.shape_build(profile_kind=profile_kind, mig_profile=mig, kind="batch")
    assert serving.placement == "spread"
    assert batch.placement == ""
    assert serving.kind == batch.kind == profile_kind
