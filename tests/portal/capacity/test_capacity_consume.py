"""Attempts on nodes an autoscaled pool asked for name the ProvisioningRequest they consume.

The launch spec is built from stored rows: a `NodeProvision` (requested or provisioned)
that names the request gives its ProvisioningRequest's name (one per node when an ask
was split, portal/k8s/provisioning.py), in the bulk launch path without a query per
request."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from portal.models import Attempt, GpuRequest, Node, NodeProvision, Pool, Quota
from portal.services.attempts import attempts_launch, launch_spec
from portal.services.autoscale import autoscale_step
from portal.tick.run import run_tick
from tests.base import make_world, submit

pytestmark = pytest.mark.django_db


def _autoscaled(name: str = "a100-train", max_nodes: int = 6) -> Pool:
    Pool.objects.filter(name=name).update(
        autoscaled=True, min_nodes=0, max_nodes=max_nodes, node_gpus=8, idle_release_s=300
    )
    return Pool.objects.get(name=name)


@pytest.fixture
def launched(monkeypatch: pytest.MonkeyPatch) -> dict[int, Any]:
    """The specs the backend was given, by request id (bulk and one by one); see `tick`."""
    from portal import backends

    inner = backends.get_backend()
    seen: dict[int, Any] = {}

    class Recording:
        def launch(self, spec: Any) -> None:
            seen[spec.request_id] = spec
            inner.launch(spec)

        def launch_many(self, specs: list[Any]) -> None:
            seen.update({s.request_id: s for s in specs})
            inner.launch_many(specs)

        def __getattr__(self, name: str) -> object:
            return getattr(inner, name)

    monkeypatch.setattr("portal.services.attempts.get_backend", lambda: Recording())
    return seen


def tick(capture: Any, now: Any) -> None:
    """A tick, and its launches (they run once the tick's transaction commits)."""
    with capture(execute=True):
        run_tick(now)


def test_a_split_ask_gives_each_request_the_part_its_node_was_asked_by(
    launched: dict[int, Any], django_capture_on_commit_callbacks: Any
) -> None:
    w = make_world()
    _autoscaled()
    Quota.objects.filter(team=w.vision, pool__name="a100-train").update(
        nominal_milli=48000, borrowing_limit_milli=0
    )
    first = [submit(w.bob, w.vision, count=8) for _ in range(4)]
    burst = [submit(w.bob, w.vision, count=8) for _ in range(2)]
    t0 = timezone.now()
    tick(django_capture_on_commit_callbacks, t0)
    # The pool's own nodes: ordinary launches, no ProvisioningRequest.
    assert {launched[r.pk].provisioning_request for r in first} == {""}

    autoscale_step(t0 + timedelta(seconds=10))
    provision = NodeProvision.objects.get()
    assert provision.nodes == 2 and not provision.atomic
    ready = provision.ready_at + timedelta(seconds=1)
    autoscale_step(ready)
    tick(django_capture_on_commit_callbacks, ready)
    first_id, second_id = provision.request_ids
    assert launched[first_id].provisioning_request == f"{provision.name}-1"
    assert launched[second_id].provisioning_request == f"{provision.name}-2"
    assert {first_id, second_id} == {r.pk for r in burst}


def test_every_member_of_a_gang_names_its_atomic_request(
    launched: dict[int, Any], django_capture_on_commit_callbacks: Any
) -> None:
    w = make_world()
    _autoscaled()
    Node.objects.filter(pool__name="a100-train").update(cordoned=True)
    gang = submit(w.bob, w.vision, count=8, pods=2)
    t0 = timezone.now()
    tick(django_capture_on_commit_callbacks, t0)
    autoscale_step(t0)
    provision = NodeProvision.objects.get()
    assert provision.atomic
    ready = provision.ready_at + timedelta(seconds=1)
    autoscale_step(ready)
    tick(django_capture_on_commit_callbacks, ready)
    spec = launched[gang.pk]
    assert [m.provisioning_request for m in spec.members()] == [provision.name] * 2


def test_a_relaunch_reads_the_name_from_the_stored_provision() -> None:
    """The reconciler's relaunch (`attempt_launch`) builds the spec alone: same name, also
    while the nodes are still being added."""
    w = make_world()
    pool = _autoscaled()
    req = submit(w.bob, w.vision, count=8)
    other = submit(w.bob, w.vision, count=1)
    run_tick()
    for state in (NodeProvision.State.REQUESTED, NodeProvision.State.PROVISIONED):
        NodeProvision.objects.all().delete()
        NodeProvision.objects.create(
            pool=pool, name="qm-a100-train-abc", nodes=1, request_ids=[req.pk], state=state
        )
        attempt = Attempt.objects.get(request=req)
        assert launch_spec(attempt).provisioning_request == "qm-a100-train-abc"
        assert launch_spec(Attempt.objects.get(request=other)).provisioning_request == ""
    # A failed ask booked nothing.
    NodeProvision.objects.update(state=NodeProvision.State.FAILED)
    assert launch_spec(Attempt.objects.get(request=req)).provisioning_request == ""


def test_the_bulk_launch_reads_the_provisions_once_whatever_the_number_of_requests() -> None:
    w = make_world()
    pool = _autoscaled()
    Quota.objects.filter(team=w.vision, pool__name="a100-train").update(
        nominal_milli=48000, borrowing_limit_milli=0
    )

    def admitted(n: int) -> list[int]:
        reqs = [submit(w.bob, w.vision, count=1) for _ in range(n)]
        NodeProvision.objects.create(
            pool=pool,
            name=f"qm-a100-train-{n}",
            nodes=n,
            request_ids=[r.pk for r in reqs],
        )
        run_tick()
        ids = list(Attempt.objects.filter(request__in=reqs).values_list("pk", flat=True))
        Attempt.objects.filter(pk__in=ids).update(state=Attempt.State.ADMITTED)
        return ids

    counts = []
    for n in (1, 4):
        ids = admitted(n)
        with CaptureQueriesContext(connection) as queries:
            attempts_launch(ids)
        counts.append(len(queries))
    assert counts[0] == counts[1]
    assert GpuRequest.objects.filter(state=GpuRequest.State.ADMITTED).count() >= 5
