"""Policy history: every applied quota, class, pool or profile change is a version, and
each of the tick's decisions records the version in force."""

from __future__ import annotations

import pytest
from django.test import Client

from portal.models import Decision, PolicyVersion, Pool, Quota, WorkloadClass
from portal.services.pools import workload_class_update
from portal.services.teams import quota_set, team_create
from portal.tick.run import run_tick
from tests.base import make_world, submit

pytestmark = pytest.mark.django_db


def test_each_applied_change_is_a_version_and_decisions_link_to_the_one_in_force(
    client: Client,
) -> None:
    w = make_world()
    first = PolicyVersion.objects.order_by("-number").values_list("number", flat=True).first()
    pool = Pool.objects.get(name="a100-train")
    quota_set(actor=w.dave, team=w.vision, pool=pool, nominal_milli=0,
                       borrowing_limit_milli=0)  # fmt: skip
    v1 = PolicyVersion.objects.order_by("-number").first()
    assert v1 is not None and v1.action == "quota.set"
    assert v1.number == (first or 0) + 1 and v1.actor_name == "dave"
    assert v1.after["nominal_milli"] == 0
    req = submit(w.bob, w.vision, count=1)
    run_tick()
    waited = Decision.objects.get(request=req, kind="wait")
    assert waited.policy_version == v1.number

    quota_set(actor=w.dave, team=w.vision, pool=pool, nominal_milli=16000)
    workload_class_update(
        actor=w.dave, workload_class=WorkloadClass.objects.get(name="training"), band=110
    )
    v3 = PolicyVersion.objects.order_by("-number").first()
    assert v3 is not None and v3.number == v1.number + 2 and v3.action == "class.update"
    run_tick()
    admitted = Decision.objects.get(request=req, kind="admit")
    assert admitted.policy_version == v3.number

    # Changes that are not policy make no version.
    team_create(actor=w.dave, name="robotics")
    assert PolicyVersion.objects.order_by("-number").first() == v3

    client.force_login(w.dave)
    page = client.get("/api/v1/policy/versions/").json()
    assert [r["number"] for r in page["results"][:3]] == [v3.number, v3.number - 1, v1.number]
    decisions = client.get(f"/api/v1/decisions/?request={req.pk}").json()["results"]
    assert {d["policy_version"] for d in decisions} == {v1.number, v3.number}
    client.force_login(w.bob)
    assert client.get("/api/v1/policy/versions/").status_code == 403
    assert Quota.objects.get(team=w.vision, pool=pool).nominal_milli == 16000


def test_a_request_filter_past_a_database_key_is_a_400_naming_it(client: Client) -> None:
    w = make_world()
    client.force_login(w.dave)
    for value in ("-1831027545184673215513886720", str(2**63), "0"):
        response = client.get(f"/api/v1/decisions/?request={value}")
        assert response.status_code == 400 and "request" in response.json()["errors"], value
