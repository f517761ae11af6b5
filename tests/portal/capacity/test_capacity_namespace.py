"""An autoscaled pool's asks live in the namespace of the team they are for.

The cluster autoscaler looks a pod's `consume-provisioning-request` name up in the pod's own
namespace (the team's), so each ask covers the requests of one team, is stored with that
namespace, and is created and read there by the backend; an attempt names only an ask of its
own namespace."""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone

from portal.models import Attempt, GpuRequest, Node, NodeProvision, Pool
from portal.services import autoscale
from portal.services import provisioning as consume
from portal.services.autoscale import autoscale_step
from portal.tick.run import run_tick
from tests.base import make_world, submit

pytestmark = pytest.mark.django_db


class Asked:
    """A backend that records the asks it is given and where it reads their state."""

    def __init__(self) -> None:
        self.created: list[tuple[str, int, bool, str]] = []
        self.read: list[tuple[str, str]] = []

    def provisioning_request_create(
        self, name: str, pool: Any, nodes: int, atomic: bool, namespace: str = ""
    ) -> None:
        self.created.append((name, nodes, atomic, namespace))

    def provisioning_request_status(
        self, name: str, pool: Any, nodes: int, atomic: bool, namespace: str = ""
    ) -> tuple[str, str]:
        self.read.append((name, namespace))
        return "requested", ""


def _row(pk: int, count: int, namespace: str, pods: int = 1) -> dict[str, Any]:
    return {
        "pk": pk,
        "count": count,
        "pods": pods,
        "cpu_milli": 1000,
        "memory_mib": 1024,
        "namespace": namespace,
    }


def test_the_plan_never_mixes_teams_in_one_ask() -> None:
    pool = Pool(name="p", autoscaled=True, min_nodes=0, max_nodes=5, node_gpus=8)
    demand = [
        _row(1, 4, "vision"),
        _row(2, 4, "nlp"),
        _row(3, 8, "nlp", pods=2),
        _row(4, 2, "vision"),
    ]
    asks = autoscale.plan(pool, 0, 0, demand)
    assert [(a.namespace, a.nodes, a.atomic, a.request_ids) for a in asks] == [
        ("nlp", 2, True, (3,)),
        ("vision", 1, False, (1, 4)),  # teams in the order of their first request
        ("nlp", 1, False, (2,)),
    ]
    # No room for the last team's node: it waits; the floor ask names no team.
    tight = autoscale.plan(pool, 2, 0, demand)
    assert [(a.namespace, a.request_ids) for a in tight] == [("nlp", (3,)), ("vision", (1, 4))]
    floor = Pool(name="p", autoscaled=True, min_nodes=2, max_nodes=5, node_gpus=8)
    assert [(a.namespace, a.nodes, a.request_ids) for a in autoscale.plan(floor, 0, 0, [])] == [
        ("", 2, ())
    ]


def test_each_teams_requests_get_an_ask_in_the_teams_namespace(
    django_capture_on_commit_callbacks: Any,
) -> None:
    w = make_world()
    Pool.objects.filter(name="a100-train").update(
        autoscaled=True, min_nodes=0, max_nodes=8, node_gpus=8, idle_release_s=300
    )
    # Four nodes, all cordoned: room for four more.
    Node.objects.filter(pool__name="a100-train").update(cordoned=True)
    vision = submit(w.bob, w.vision, count=4)
    nlp = submit(w.carol, w.nlp, count=4)
    gang = submit(w.carol, w.nlp, count=4, pods=2)
    now = timezone.now()
    run_tick(now)
    assert set(
        GpuRequest.objects.filter(pk__in=[vision.pk, nlp.pk, gang.pk]).values_list(
            "state", flat=True
        )
    ) == {GpuRequest.State.PENDING}
    backend = Asked()
    with django_capture_on_commit_callbacks(execute=True):
        assert autoscale_step(now, backend)["asked"] == 3
    stored = {
        tuple(p.request_ids): (p.namespace, p.nodes, p.atomic) for p in NodeProvision.objects.all()
    }
    # Together, the two 4-GPU requests would have shared one node: now one node each.
    assert stored == {
        (gang.pk,): (w.nlp.namespace, 2, True),
        (vision.pk,): (w.vision.namespace, 1, False),
        (nlp.pk,): (w.nlp.namespace, 1, False),
    }
    assert w.vision.namespace != w.nlp.namespace
    names = {p.name: p.namespace for p in NodeProvision.objects.all()}
    assert sorted(backend.created) == sorted(
        (p.name, p.nodes, p.atomic, p.namespace) for p in NodeProvision.objects.all()
    )
    # The state is read where each ask lives.
    autoscale_step(now, backend)
    assert sorted(backend.read) == sorted(names.items())


def test_an_attempt_names_only_an_ask_of_its_own_namespace() -> None:
    w = make_world()
    Pool.objects.filter(name="a100-train").update(
        autoscaled=True, min_nodes=0, max_nodes=6, node_gpus=8
    )
    pool = Pool.objects.get(name="a100-train")
    req = submit(w.bob, w.vision, count=8)
    run_tick()
    attempt = Attempt.objects.select_related("pool", "request").get(request=req)
    assert attempt.namespace == w.vision.namespace
    # Its team's ask; one made before asks had a namespace (in the portal's, named as
    # before); another team's ask of the same name would be looked up in vain: none.
    cases = [(w.vision.namespace, "qm-own"), ("", "qm-old"), (w.nlp.namespace, "")]
    for namespace, expected in cases:
        NodeProvision.objects.all().delete()
        NodeProvision.objects.create(
            pool=pool,
            name=expected or "qm-other",
            nodes=1,
            request_ids=[req.pk],
            namespace=namespace,
        )
        assert consume.consumed([attempt]).get(attempt.pk, "") == expected
