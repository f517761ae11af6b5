"""The autoscaling page and the rollouts list: what admins and auditors read, nobody else."""

from __future__ import annotations

import pytest
from django.test import Client

from portal.models import GpuRequest, Node, NodeProvision, Pool, Rollout
from portal.services.autoscale import ADDED_BY, RELEASED
from tests.base import World, make_world, submit

pytestmark = pytest.mark.django_db


@pytest.fixture
def world() -> World:
    return make_world()


def _scaled(world: World) -> tuple[Pool, GpuRequest]:
    pool = Pool.objects.get(name="a100-train")
    Pool.objects.filter(pk=pool.pk).update(autoscaled=True, min_nodes=1, max_nodes=6)
    req = submit(world.bob, world.vision, count=8, name="needs-a-node")
    NodeProvision.objects.create(pool=pool, name="qm-ask-1", nodes=2, request_ids=[req.pk])
    NodeProvision.objects.create(
        pool=pool, name="qm-ask-0", nodes=1, state=NodeProvision.State.PROVISIONED
    )
    first = Node.objects.filter(pool=pool).order_by("name")
    Node.objects.filter(pk=first[0].pk).update(labels={ADDED_BY: "qm-ask-0"})
    Node.objects.filter(pk=first[1].pk).update(labels={ADDED_BY: "qm-ask-0", RELEASED: "true"})
    return pool, req


def test_it_shows_demand_provisioning_requests_and_nodes_coming_and_going(
    world: World, django_assert_max_num_queries
) -> None:  # noqa: ANN001
    pool, req = _scaled(world)
    live = Node.objects.filter(pool=pool).count() - 1
    c = Client()
    c.force_login(world.dave)
    with django_assert_max_num_queries(12):
        page = c.get("/ops/autoscaling/").content.decode()
    assert 'data-testid="autoscaled-pools"' in page
    assert f"<td>{live}</td>" in page and "1 and 6 nodes" in page and "2 nodes" in page
    assert 'data-testid="in-flight">2 nodes on the way' in page
    assert "qm-ask-1" in page and f"#{req.pk}</a>" in page and "provisioned" in page
    nodes = page[page.index('data-testid="autoscaling-nodes"') :]
    assert "qm-ask-0" in nodes and "released" in nodes and "in service" in nodes
    # linked from the menu and from the overview's autoscaling in progress
    assert 'href="/ops/autoscaling/" class="on"' in page
    overview = c.get("/ops/overview/").content.decode()
    assert 'data-testid="overview-autoscaling"' in overview


def test_its_queries_do_not_grow_with_the_fleet(
    world: World, django_assert_max_num_queries
) -> None:  # noqa: ANN001
    pool, _ = _scaled(world)
    for i in range(30):
        NodeProvision.objects.create(pool=pool, name=f"qm-more-{i}", nodes=1)
    c = Client()
    c.force_login(world.dave)
    with django_assert_max_num_queries(12):
        assert c.get("/ops/autoscaling/").status_code == 200


def test_only_admins_and_auditors_read_it(world: World) -> None:
    bob = Client()
    bob.force_login(world.bob)
    assert bob.get("/ops/autoscaling/").status_code == 403
    assert bob.get("/ops/autoscaling/", HTTP_HX_REQUEST="true").status_code == 403
    assert bob.get("/ops/rollouts/").status_code == 403


def test_rollouts_have_a_list_of_their_own(world: World) -> None:
    pool = Pool.objects.get(name="a100-train")
    r = Rollout.objects.create(pool=pool, kind="driver", target="550.90", created_by=world.dave)
    c = Client()
    c.force_login(world.dave)
    page = c.get("/ops/rollouts/").content.decode()
    assert f'href="/ops/rollouts/{r.pk}/"' in page and "550.90" in page and "wave 0" in page
    assert 'href="/ops/rollouts/" class="on"' in page
    assert 'href="/ops/rollouts/" class="on"' in c.get(f"/ops/rollouts/{r.pk}/").content.decode()
