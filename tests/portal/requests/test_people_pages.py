"""The submit form and its preview, My jobs, templates, queue position notes, error pages."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from portal.models import GpuRequest, RequestTemplate
from portal.templatetags.qm import duration, gpu_count, gpus
from portal.tick import apply
from portal.tick import run as tick
from tests.base import World, api_secret, make_world, submit
from tests.portal.requests.test_views import form_data

pytestmark = pytest.mark.django_db


@pytest.fixture
def world() -> World:
    return make_world()


def login(user) -> Client:  # noqa: ANN001
    c = Client()
    c.force_login(user)
    return c


# -- the preview and the submit ------------------------------------------------------


def test_the_preview_says_rejected_once(world: World) -> None:
    r = login(world.bob).post(reverse("portal:request-preview"), form_data(world, count=16))
    text = r.content.decode()
    assert "would be rejected: no node in pool a100-train can hold 16" in text
    assert "rejected: rejected" not in text
    assert 'data-outcome="rejected"' in text


def test_what_the_preview_rejects_cannot_be_submitted(world: World) -> None:
    r = login(world.bob).post(reverse("portal:request-submit"), form_data(world, count=16))
    assert r.status_code == 400
    assert "would be rejected: no node in pool a100-train can hold 16" in r.content.decode()
    assert not GpuRequest.objects.exists()


def test_an_invalid_field_gets_no_verdict(world: World) -> None:
    r = login(world.bob).post(reverse("portal:request-preview"), form_data(world, count=0))
    text = r.content.decode()
    assert "fits now" not in text and 'data-outcome="invalid"' in text
    assert "Devices per pod" in text  # the field that is wrong


def test_a_submit_says_submitted(world: World) -> None:
    r = login(world.bob).post(reverse("portal:request-submit"), form_data(world), follow=True)
    req = GpuRequest.objects.get()
    assert r.redirect_chain[-1][0] == reverse("portal:request-detail", args=[req.pk])
    assert f"Request {req.pk} submitted (resnet)" in r.content.decode()


def test_the_form_offers_profiles_by_readable_name(world: World) -> None:
    text = login(world.bob).get(reverse("portal:request-submit")).content.decode()
    assert ">whole GPU<" in text
    assert "shared: 0.5 GPU, 10 GB memory" in text or "MIG 3g.40gb" in text


# -- resubmit and templates -----------------------------------------------------------


def test_resubmit_fills_the_form_from_an_earlier_request(world: World) -> None:
    req = submit(
        world.bob, world.vision, name="resnet-7", count=2, env={"EPOCHS": "3"}, cpu_milli=4000
    )
    r = login(world.bob).get(reverse("portal:request-submit"), {"from": req.pk})
    form = r.context["form"]
    assert form.initial["name"] == "resnet-7"
    assert form.initial["count"] == 2 and form.initial["cpu_milli"] == 4000
    assert form.initial["env"] == "EPOCHS=3"
    assert form.initial["command"] == "python train.py"
    assert 'value="resnet-7"' in r.content.decode()


def test_resubmit_of_another_teams_request_is_404(world: World) -> None:
    req = submit(world.bob, world.vision, name="secret-run")
    r = login(world.carol).get(reverse("portal:request-submit"), {"from": req.pk})
    assert r.status_code == 404 and b"secret-run" not in r.content


def test_a_template_is_saved_used_and_deleted_by_its_owner_only(world: World) -> None:
    bob = login(world.bob)
    data = form_data(world, name="nightly", count=2, template_name="two A100s", save_template="1")
    r = bob.post(reverse("portal:request-submit"), data)
    assert r.status_code == 200 and "Saved as template" in r.content.decode()
    assert not GpuRequest.objects.exists()  # saving is not submitting
    tpl = RequestTemplate.objects.get(user=world.bob)
    assert tpl.name == "two A100s" and tpl.fields["count"] == "2"
    r = bob.get(reverse("portal:request-submit"), {"template": tpl.pk})
    assert r.context["form"].initial["name"] == "nightly"
    assert "two A100s" in bob.get(reverse("portal:home")).content.decode()
    carol = login(world.carol)
    assert carol.get(reverse("portal:request-submit"), {"template": tpl.pk}).status_code == 404
    assert carol.post(reverse("portal:template-delete", args=[tpl.pk])).status_code == 404
    assert RequestTemplate.objects.filter(pk=tpl.pk).exists()
    bob.post(reverse("portal:template-delete", args=[tpl.pk]))
    assert not RequestTemplate.objects.filter(pk=tpl.pk).exists()


def test_a_template_needs_a_name(world: World) -> None:
    r = login(world.bob).post(
        reverse("portal:request-submit"), form_data(world, template_name=" ", save_template="1")
    )
    assert r.status_code == 400 and not RequestTemplate.objects.exists()


# -- My jobs --------------------------------------------------------------------------


def test_my_jobs_has_submitted_started_and_runtime(world: World) -> None:
    req = submit(world.bob, world.vision, name="runs")
    tick.run_tick()
    attempt = req.attempts.get()
    attempt.started_at = timezone.now() - timedelta(minutes=12, seconds=5)
    attempt.state = "running"
    attempt.save()
    GpuRequest.objects.filter(pk=req.pk).update(state="running")
    text = login(world.bob).get(reverse("portal:home")).content.decode()
    # secondary columns: shown from 600 px up (site.css hides .secondary on a phone), the
    # start time from 1400 px up (.wide: Runtime tells it on a laptop)
    for header in ("Submitted", "Runtime"):
        assert f'<th class="secondary">{header}</th>' in text
    assert '<th class="secondary wide">Started</th>' in text
    assert '<td data-testid="runtime" class="secondary">12 min</td>' in text
    assert "Resubmit" in text


def test_my_jobs_searches_and_filters(world: World) -> None:
    a = submit(world.bob, world.vision, name="resnet-a")
    submit(
        world.bob,
        world.vision,
        name="bert-b",
        cls="interactive",
        pool_name="l4-shared",
        profile_kind="shared",
        milli=500,
        gpu_memory_mib=10240,
    )
    bob = login(world.bob)

    def names(**q: str) -> set[str]:
        rows = bob.get(reverse("portal:home"), q).context["rows"]
        return {r.name for r in rows}

    assert names(q="resnet") == {"resnet-a"}
    assert names(q=f"#{a.pk}") == {"resnet-a"}
    assert names(q="vision/train") == {"resnet-a", "bert-b"}  # the image
    assert names(state="pending") == {"resnet-a", "bert-b"}
    assert names(state="running") == set()
    interactive = str(GpuRequest.objects.get(name="bert-b").workload_class_id)
    assert names(workload_class=interactive) == {"bert-b"}
    # Another team in the filter is refused as invalid, not shown.
    assert names(team=str(world.nlp.pk)) == {"resnet-a", "bert-b"}


def test_a_long_name_wraps_in_my_jobs(world: World) -> None:
    submit(world.bob, world.vision, name="x" * 100)
    text = login(world.bob).get(reverse("portal:home")).content.decode()
    assert 'class="table-wrap"' in text and '<td class="name" title="' + "x" * 100 in text


# -- queue position notes -----------------------------------------------------------


def test_a_position_note_says_who_arrived_ahead() -> None:
    old = {"a": 1, "b": 2, "c": 3, "me": 4}
    new = {"a": 1, "b": 2, "c": 3, "x": 4, "y": 5, "me": 6}
    assert apply.position_notes(old, new)["me"] == (
        "moved from #4 to #6: 2 requests of higher class, priority or fair share arrived"
    )


def test_a_position_note_counts_those_that_left_even_unseen() -> None:
    # #1 and #2 were admitted by the last tick (their positions are not kept), "c" now.
    old = {"c": 3, "me": 4}
    new = {"c": 1, "me": 2}
    assert apply.position_notes(old, new)["me"] == (
        "moved from #4 to #2: 2 requests ahead of it started or left the queue"
    )


def test_a_position_note_says_who_passed_it() -> None:
    old = {"a": 1, "me": 2, "b": 3}
    new = {"a": 1, "b": 2, "me": 3}
    notes = apply.position_notes(old, new)
    assert notes["me"] == (
        "moved from #2 to #3: 1 request moved ahead (priority, fair share or escalation)"
    )
    assert notes["b"] == "moved from #3 to #2: 1 request fell behind it"
    assert "a" not in notes


def test_the_tick_stores_the_note_and_the_pages_show_it(world: World) -> None:
    for i in range(6):
        submit(world.bob, world.vision, count=8, name=f"big-{i}")
    tick.run_tick()
    last = GpuRequest.objects.filter(state="pending").order_by("-queue_position").first()
    assert last is not None and last.queue_position
    before = last.queue_position
    # Higher-priority work arrives: a lead's request of a stronger class goes first.
    submit(world.alice, world.vision, count=8, name="urgent", cls="interactive", priority=10)
    tick.run_tick()
    last.refresh_from_db()
    urgent = GpuRequest.objects.get(name="urgent")
    # The four admitted by the first tick no longer count; the urgent one goes first.
    assert urgent.queue_position == 1
    assert (before, last.queue_position) == (6, 3)
    assert last.position_note == (
        "moved from #6 to #3: 4 requests ahead of it started or left the queue; "
        "1 request of higher class, priority or fair share arrived"
    )
    bob = login(world.bob)
    text = bob.get(reverse("portal:request-detail", args=[last.pk])).content
    assert last.position_note.encode() in text
    api = bob.get(reverse("api:request-detail", args=[last.pk])).json()
    assert api["queue_position_note"] == last.position_note


# -- error pages, numbers -------------------------------------------------------------


def test_a_404_is_a_page_with_navigation(world: World) -> None:
    r = login(world.bob).get("/no-such-page/")
    text = r.content.decode()
    assert r.status_code == 404
    assert "Nothing here" in text and 'href="/queue/"' in text and "site.css" in text
    assert "favicon.svg" in text


def test_a_403_is_a_page_with_navigation(world: World) -> None:
    r = login(world.bob).get(reverse("portal:audit"))
    assert r.status_code == 403
    assert "You may not do that" in r.content.decode() and "My jobs" in r.content.decode()


def test_the_500_page_stands_alone(world: World) -> None:
    from django.test import RequestFactory
    from django.views.defaults import server_error

    r = server_error(RequestFactory().get("/"))
    assert r.status_code == 500 and b"Something went wrong" in r.content


def test_numbers_read_naturally() -> None:
    assert [gpus(m) for m in (16000, 1500, 4666, 125, 5, 0, None)] == [
        "16",
        "1.5",
        "4.67",
        "0.13",
        "0.005",
        "0",
        "",
    ]
    assert [gpu_count(m) for m in (1000, 500, 2000, 1500)] == [
        "1 GPU",
        "0.5 GPU",
        "2 GPUs",
        "1.5 GPUs",
    ]
    assert [duration(s) for s in (45, 725, 7500, 97200)] == [
        "45 s",
        "12 min",
        "2 h 5 min",
        "1 d 3 h",
    ]


def test_a_slice_is_written_one_way_on_pages_and_in_the_api(world: World) -> None:
    req = submit(
        world.bob,
        world.vision,
        pool_name="l4-shared",
        profile_kind="shared",
        milli=250,
        gpu_memory_mib=5120,
        name="sliced",
    )
    words = "shared: 0.25 GPU, 5 GB memory"
    assert req.profile_label == words
    c = login(world.bob)
    for url in ("/", f"/requests/{req.pk}/", "/queue/"):
        body = c.get(url).content.decode()
        assert words in body, url
        assert "250m" not in body and "5120 MiB" not in body, url
    token = Client(HTTP_AUTHORIZATION=f"Bearer {api_secret(world.bob)}")
    api = token.get(f"/api/v1/requests/{req.pk}/").json()
    assert api["profile"] == words
