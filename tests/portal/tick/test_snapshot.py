from __future__ import annotations

import dataclasses

import pytest
from django.utils import timezone

from portal.models import Device
from portal.tick.snapshot import build_snapshot
from scheduling import types as st
from tests.base import make_world

pytestmark = pytest.mark.django_db


def _device(snapshot: st.Snapshot, node: str, index: int) -> st.Device:
    found = next(n for n in snapshot.nodes if n.name == node)
    return found.devices[index]


def test_it_reads_fixed_mig_layouts_and_foreign_processes_from_the_device_rows() -> None:
    make_world()
    node = Device.objects.filter(partitioning="mig").values_list("node__name", flat=True)[0]
    layout = [
        {"profile": "3g.40gb", "start": 0, "size": 4},
        {"profile": "2g.20gb", "start": 4, "size": 2},
    ]
    Device.objects.filter(node__name=node, index__in=(0, 1)).update(mig_instances=layout)
    Device.objects.filter(node__name=node, index=2).update(processes=[{"pid": 4242}])
    Device.objects.filter(node__name=node, index=3).update(processes=[])
    snapshot, _ = build_snapshot(timezone.now())
    want = (st.MigInstance("3g.40gb", 0, 4), st.MigInstance("2g.20gb", 4, 2))
    assert _device(snapshot, node, 0).mig_instances == want
    assert _device(snapshot, node, 1).mig_instances == want
    other = Device.objects.get(node__name=node, index=2).mig_instances
    assert _device(snapshot, node, 2).mig_instances == tuple(
        st.MigInstance(m["profile"], m["start"], m["size"]) for m in other
    )
    assert other != layout
    # A process the portal did not place takes the device out; an empty list does not.
    assert _device(snapshot, node, 2).healthy is False
    assert _device(snapshot, node, 3).healthy is True


# (estimated_runtime_s, max_runtime_s; 0: none) -> the runtime the core expects, in seconds
RUNTIMES = [((3600, 0), 3600), ((3600, 600), 600), ((0, 900), 900), ((0, 0), None)]


def test_the_expected_runtime_is_the_estimate_capped_by_the_hard_limit() -> None:
    """Pending and running alike (the snapshot's loops compute it inline)."""
    from portal.models import Attempt, GpuRequest
    from portal.tick.run import run_tick
    from tests.base import submit

    w = make_world()
    reqs = [submit(w.alice, w.vision) for _ in RUNTIMES]
    for req, ((estimate, limit), _) in zip(reqs, RUNTIMES, strict=True):
        GpuRequest.objects.filter(pk=req.pk).update(
            estimated_runtime_s=estimate, max_runtime_s=limit
        )
    snapshot, _ = build_snapshot(timezone.now())
    pending = {p.id: p for p in snapshot.pending}
    for req, (_, want) in zip(reqs, RUNTIMES, strict=True):
        assert pending[str(req.pk)].expected_runtime_ms == (want and want * 1000)
    run_tick()
    assert Attempt.objects.filter(request__in=reqs).count() == len(reqs)
    snapshot, _ = build_snapshot(timezone.now())
    running = {r.request_id: r for r in snapshot.running}
    for req, (_, want) in zip(reqs, RUNTIMES, strict=True):
        r = running[str(req.pk)]
        assert r.expected_end_ms == (want and r.started_at_ms + want * 1000)


def test_a_row_read_again_unchanged_keeps_its_object_and_a_changed_one_is_read_anew() -> None:
    """The tick's snapshot keeps the last read's frozen objects by the rows they came from:
    what the core reads changes the moment a row or a name does; the status the apply step
    compares with is read fresh every time. A read without `keep` (a preview) keeps none."""
    from portal.models import Attempt, GpuRequest, Team
    from portal.tick.run import run_tick
    from tests.base import submit

    w = make_world()
    kept, changed, started = (submit(w.alice, w.vision) for _ in range(3))
    run_tick()
    assert Attempt.objects.filter(request__in=(kept, changed, started)).count() == 3
    later = [submit(w.alice, w.vision, cls="interactive") for _ in range(2)]
    first, _ = build_snapshot(timezone.now(), keep=True)
    GpuRequest.objects.filter(pk=later[0].pk).update(status_message="seen by a test")
    GpuRequest.objects.filter(pk=later[1].pk).update(priority=7)
    moment = timezone.now()
    Attempt.objects.filter(request=started).update(last_checkpoint_at=moment)
    second, ctx = build_snapshot(timezone.now(), keep=True)

    def pending(s: st.Snapshot) -> dict[str, st.PendingRequest]:
        return {p.id: p for p in s.pending}

    def running(s: st.Snapshot) -> dict[str, st.Running]:
        return {r.request_id: r for r in s.running}

    one, two = str(later[0].pk), str(later[1].pk)
    assert pending(second)[one] is pending(first)[one]
    assert ctx.requests[one].status_message == "seen by a test"
    assert pending(second)[two] is not pending(first)[two]
    assert (pending(first)[two].priority, pending(second)[two].priority) == (0, 7)
    assert running(second)[str(kept.pk)] is running(first)[str(kept.pk)]
    assert running(second)[str(started.pk)].last_checkpoint_ms == int(moment.timestamp() * 1000)
    assert running(first)[str(started.pk)].last_checkpoint_ms != int(moment.timestamp() * 1000)

    # Whether it preempts is read from its status: the one status the core reads.
    GpuRequest.objects.filter(pk=later[0].pk).update(status_code="preempting")
    again, _ = build_snapshot(timezone.now(), keep=True)
    assert pending(again)[one].preempting and not pending(second)[one].preempting

    # A renamed team renames its work: the names are part of what the objects were made of.
    Team.objects.filter(pk=w.vision.pk).update(name="vision-renamed")
    third, _ = build_snapshot(timezone.now(), keep=True)
    assert {p.team for p in third.pending} == {"vision-renamed"}
    assert {r.team for r in third.running} == {"vision-renamed"}
    assert third.pending == tuple(
        dataclasses.replace(p, team="vision-renamed") for p in again.pending
    )
    preview, _ = build_snapshot(timezone.now())
    assert preview.pending == third.pending
    assert not set(map(id, preview.pending)) & set(map(id, third.pending))
