"""The what-if pages: draft, replay as a task with a progress bar, compare, apply (audited)."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from portal.models import AuditEvent, PolicyVersion, Quota, WhatIfRun
from tests.base import World, make_world
from tests.portal.policy.test_whatif import _history

pytestmark = pytest.mark.django_db


@pytest.fixture
def world() -> World:
    w = make_world()
    _history(w)
    return w


def _draft(client: Client, capture: Any, text: str, days: str = "3") -> Any:
    with capture(execute=True):
        return client.post("/ops/whatif/", {"days": days, "settings": text})


def test_an_admin_drafts_a_change_sees_the_comparison_and_applies_it(
    world: World, client: Client, django_capture_on_commit_callbacks: Any
) -> None:
    client.force_login(world.dave)
    response = _draft(
        client, django_capture_on_commit_callbacks, "quota.vision.a100-train.borrowing=0"
    )
    run = WhatIfRun.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/ops/whatif/{run.pk}/"
    # the task ran (eagerly here) after the draft committed
    assert run.state == "done" and run.progress == 100
    assert set(run.result) == {"current", "proposed", "teams"}
    page = client.get(f"/ops/whatif/{run.pk}/").content.decode()
    assert 'data-testid="comparison"' in page and 'data-testid="team-vision"' in page
    assert "<progress" not in page

    response = client.post(f"/ops/whatif/{run.pk}/apply/")
    assert response.status_code == 302
    quota = Quota.objects.get(team=world.vision, pool__name="a100-train")
    assert quota.borrowing_limit_milli == 0 and quota.nominal_milli == 16000
    event = AuditEvent.objects.get(action="whatif.apply")
    assert event.after["settings"] == {"quota.vision.a100-train.borrowing": "0"}
    assert event.after["replay"]["proposed"] == run.result["proposed"]
    assert PolicyVersion.objects.filter(action="quota.set").exists()
    # Applying twice is refused; nothing changes.
    again = client.post(f"/ops/whatif/{run.pk}/apply/")
    assert (
        again.status_code == 400 and AuditEvent.objects.filter(action="whatif.apply").count() == 1
    )


def test_a_running_replay_shows_a_progress_bar_polled_by_htmx(world: World, client: Client) -> None:
    run = WhatIfRun.objects.create(days=3, changes={"policy.preempt_after_s": "60"},
                                   state="running", progress=40)  # fmt: skip
    client.force_login(world.dave)
    page = client.get(f"/ops/whatif/{run.pk}/", headers={"HX-Request": "true"}).content.decode()
    assert '<progress id="whatif-progress"' in page and 'value="40"' in page
    assert 'hx-trigger="every 2s"' in page and "<html" not in page


@pytest.mark.parametrize(
    ("text", "days", "error"),
    [
        ("quota.vision.nowhere=4", "3", "no pool"),
        ("not a setting", "3", "expected KEY=VALUE"),
        ("", "3", "at least one change"),
        ("policy.preempt_after_s=60", "500", "Between 1 and 90"),
    ],
)
def test_a_bad_draft_is_a_form_error_and_stores_nothing(
    world: World, client: Client, django_capture_on_commit_callbacks: Any, text: str,
    days: str, error: str,
) -> None:  # fmt: skip
    client.force_login(world.dave)
    response = _draft(client, django_capture_on_commit_callbacks, text, days)
    assert response.status_code == 400 and error in response.content.decode()
    assert not WhatIfRun.objects.exists()


def test_a_node_count_is_replayed_but_never_applied(
    world: World, client: Client, django_capture_on_commit_callbacks: Any
) -> None:
    client.force_login(world.dave)
    _draft(
        client,
        django_capture_on_commit_callbacks,
        "quota.vision.a100-train=8\npool.a100-train.nodes=6",
    )
    run = WhatIfRun.objects.get()
    assert run.result["proposed"]["capacity_gpus"] == run.result["current"]["capacity_gpus"] + 16
    response = client.post(f"/ops/whatif/{run.pk}/apply/")
    assert response.status_code == 400 and b"a replay only" in response.content
    # all or nothing: the quota part was not applied either
    assert Quota.objects.get(team=world.vision, pool__name="a100-train").nominal_milli == 16000
    assert not AuditEvent.objects.filter(action="whatif.apply").exists()


def test_only_admins_draft_and_apply(world: World, client: Client) -> None:
    run = WhatIfRun.objects.create(days=3, changes={"policy.preempt_after_s": "60"},
                                   state="done", result={"current": {}, "proposed": {},
                                                         "teams": {}})  # fmt: skip
    client.force_login(world.bob)
    assert client.get("/ops/whatif/").status_code == 403
    assert client.get(f"/ops/whatif/{run.pk}/").status_code == 403
    assert client.post("/ops/whatif/", {"days": "3", "settings": "x=1"}).status_code == 403
    assert client.post(f"/ops/whatif/{run.pk}/apply/").status_code == 403
    run.refresh_from_db()
    assert run.applied_at is None


def _row(p50: int, p95: int, util: float, pre: int) -> dict[str, Any]:
    return {"requests": 10, "wait_p50_s": p50, "wait_p95_s": p95, "wait_max_s": p95,
            "utilization_pct": util, "preemptions": pre, "gpu_hours_lost": 0.0,
            "never_started": 0}  # fmt: skip


def test_the_result_reads_side_by_side_with_the_difference_in_hours_and_minutes(
    world: World, client: Client
) -> None:
    now, then = _row(600, 7200, 70.0, 2), _row(300, 3900, 74.5, 2)
    run = WhatIfRun.objects.create(
        days=3, state="done", changes={"quota.vision.a100-train": "24"},
        result={"current": now, "proposed": then,
                "teams": {"vision": {"current": now, "proposed": then}}},
    )  # fmt: skip
    client.force_login(world.dave)
    page = client.get(f"/ops/whatif/{run.pk}/").content.decode()
    overall = page[page.index('data-testid="comparison"') : page.index("</table>")]
    assert "<td>10 min</td><td>5 min</td><td>−5 min</td>" in overall
    assert "<td>2 h</td><td>1 h 5 min</td><td>−55 min</td>" in overall
    assert "<td>70.0 %</td><td>74.5 %</td><td>+4.5 points</td>" in overall
    assert "<td>2</td><td>2</td><td>no difference</td>" in overall
    assert 'data-testid="team-vision"' in page and 'data-testid="no-difference"' not in page
    # Apply asks first, listing the exact change with the value it replaces
    confirm = page[page.index('data-testid="apply-confirm"') :]
    assert "guarantee of vision in a100-train: 16 GPUs → 24 GPUs" in confirm
    assert "Confirm: apply 1 change" in confirm


def test_it_says_when_a_change_makes_no_difference(world: World, client: Client) -> None:
    same = _row(600, 7200, 70.0, 2)
    run = WhatIfRun.objects.create(
        days=3, state="done", changes={"policy.preempt_after_s": "60"},
        result={"current": same, "proposed": same,
                "teams": {"vision": {"current": same, "proposed": same}}},
    )  # fmt: skip
    client.force_login(world.dave)
    page = client.get(f"/ops/whatif/{run.pk}/").content.decode()
    assert 'data-testid="no-difference"' in page and "No difference" in page
    assert "preempt_after_s of the active profile: 300 → 60" in page


def test_the_change_is_picked_in_a_form_a_guarantee_and_a_knob(
    world: World, client: Client, django_capture_on_commit_callbacks: Any
) -> None:
    from portal.models import Pool

    pool = Pool.objects.get(name="a100-train")
    client.force_login(world.dave)
    page = client.get("/ops/whatif/").content.decode()
    assert "Preempt only after waiting (preempt_after_s, now 300)" in page
    with django_capture_on_commit_callbacks(execute=True):
        r = client.post(
            "/ops/whatif/",
            {"days": "3", "team": world.vision.pk, "pool": pool.pk, "quota": "24",
             "knob": "preempt_after_s", "knob_value": "60"},
        )  # fmt: skip
    run = WhatIfRun.objects.get()
    assert r.status_code == 302
    assert run.changes == {"quota.vision.a100-train": "24", "policy.preempt_after_s": "60"}


def test_a_half_picked_change_names_the_missing_field(world: World, client: Client) -> None:
    client.force_login(world.dave)
    r = client.post("/ops/whatif/", {"days": "3", "team": world.vision.pk, "knob": "packer"})
    page = r.content.decode()
    assert r.status_code == 400 and not WhatIfRun.objects.exists()
    assert "Pick the team, the pool and the new guarantee." in page
    assert "Give the knob&#x27;s new value." in page
    r = client.post("/ops/whatif/", {"days": "3"})
    assert r.status_code == 400 and "Propose at least one change." in r.content.decode()
