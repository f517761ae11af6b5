"""Serving workloads run replicas of a synthetic model server in the
simulated cluster, spread over nodes, scaled and rolled over to a new revision from the
API and the page, audited, with their request path read back as series."""

from __future__ import annotations

import re
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client, override_settings
from rest_framework.test import APIClient

from portal.backends import serving_replicas
from portal.models import (
    Attempt,
    AuditEvent,
    GpuRequest,
    RevisionChange,
    ServingSample,
    SimulatedWorkload,
)
from portal.services import serving_samples as serving_metrics
from portal.tick.run import run_tick
from tests.base import make_world, submit, submit_serving

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _servers() -> Iterator[None]:
    """Fast warm-up; every replica process the test started is stopped after it."""
    with override_settings(SIMULATED_SERVING_WARMUP_S=0.2, SIMULATED_SERVING_RPS=6):
        yield
    for spec in SimulatedWorkload.objects.values_list("spec", flat=True):
        serving_replicas.stop(spec.get("serving"))


def _serve(user: Any, team: Any, replicas: int = 2, **kw: Any) -> GpuRequest:
    return submit_serving(
        user,
        team,
        pods=replicas,
        model_name="meta-llama/Llama-3.1-8B-Instruct",
        model_revision="r1",
        runtime=kw.pop("runtime", "vllm"),
        image="vllm/vllm-openai:v0.6.3",
        **kw,
    )


def _wait_ready(replicas: list[dict[str, Any]], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    for r in replicas:
        while True:
            try:
                with urllib.request.urlopen(serving_replicas.url(r, "/health"), timeout=1) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, "replica never became ready"
            time.sleep(0.1)


def _replicas(attempt: Attempt) -> list[dict[str, Any]]:
    from portal.backends import get_backend

    return get_backend().serving_replicas(  # type: ignore[attr-defined, no-any-return]
        attempt.workload_name, attempt.namespace, attempt.request.pods
    )


def test_submit_checks_the_serving_fields() -> None:
    w = make_world()
    from django.core.exceptions import ValidationError

    for kw, field in (
        ({"runtime": "ollama"}, "runtime"),
        ({"model_name": ""}, "model_name"),
        ({"max_runtime_s": 60}, "max_runtime_s"),
    ):
        args = {"runtime": "vllm", "model_name": "m", **kw}
        with pytest.raises(ValidationError) as exc:
            submit_serving(w.bob, w.vision, command=["python", "train.py"], **args)
        assert field in exc.value.message_dict
    assert not GpuRequest.objects.exists()


def test_replicas_spread_run_servers_and_their_metrics_are_sampled() -> None:
    w = make_world()
    req = _serve(w.bob, w.vision)
    assert req.estimated_runtime_s == 0  # runs until stopped
    run_tick()
    attempt = req.attempts.get()
    # two replicas, one per node (spread), in the inference pool
    assert len(attempt.nodes) == 2 and len(set(attempt.nodes)) == 2
    replicas = _replicas(attempt)
    assert len(replicas) == 2 and all(serving_replicas.alive(r["pid"]) for r in replicas)
    _wait_ready(replicas)
    with urllib.request.urlopen(serving_replicas.url(replicas[0])) as resp:
        text = resp.read().decode()
    assert "vllm:time_to_first_token_seconds_bucket{" in text
    assert 'model_revision="r1"' in text and f'workload="qm-{req.pk}"' in text
    assert 'team="vision"' in text and 'pool="h100-mig"' in text and 'class="inference"' in text

    assert serving_metrics.sample_serving() == 1
    time.sleep(1.5)
    assert serving_metrics.sample_serving() == 1
    last = ServingSample.objects.filter(request=req).latest("at")
    assert last.model_revision == "r1"
    assert last.ttft_p95_seconds is not None and last.ttft_p95_seconds > 0
    assert last.batch_size is not None and last.batch_size > 0
    assert last.gpu_utilization is not None and last.tokens_per_second is not None

    api = APIClient()
    api.force_authenticate(w.bob)
    r = api.get(f"/api/v1/requests/{req.pk}/metrics/")
    assert r.status_code == 200, r.content
    body = r.json()
    assert body["source"] == "samples"
    for name in ("ttft_p95_seconds", "batch_size", "queue_depth", "gpu_utilization"):
        assert body["series"][name], name
    assert body["series"]["model_revision"][-1][1] == "r1"
    assert body["slo"]["objective_seconds"] == 0.5
    assert api.get(f"/api/v1/requests/{req.pk}/metrics/?window=2d").json()["errors"] == {
        "window": ["Choose one of 1h, 6h, 24h."]
    }
    # another team's workload is not found, its metrics included
    api.force_authenticate(w.carol)
    assert api.get(f"/api/v1/requests/{req.pk}/metrics/").status_code == 404
    assert (
        api.patch(f"/api/v1/requests/{req.pk}/serving/", {"replicas": 3}, format="json").status_code
        == 404
    )


def test_a_revision_change_rolls_the_replicas_over_and_is_audited() -> None:
    w = make_world()
    req = _serve(w.bob, w.vision)
    run_tick()
    attempt = req.attempts.get()
    before = {r["pid"] for r in _replicas(attempt)}
    api = APIClient()
    api.force_authenticate(w.bob)
    bad = api.patch(
        f"/api/v1/requests/{req.pk}/serving/", {"model_revision": "no spaces"}, format="json"
    )
    assert bad.status_code == 400 and "model_revision" in bad.json()["errors"]
    r = api.patch(f"/api/v1/requests/{req.pk}/serving/", {"model_revision": "r2"}, format="json")
    assert r.status_code == 200, r.content
    assert r.json()["model_revision"] == "r2"
    after = _replicas(attempt)
    assert {x["pid"] for x in after}.isdisjoint(before)
    assert all(x["revision"] == "r2" for x in after)
    _wait_ready(after)
    with urllib.request.urlopen(serving_replicas.url(after[0])) as resp:
        assert 'model_revision="r2"' in resp.read().decode()
    change = RevisionChange.objects.get(request=req)
    assert (change.before, change.after) == ("r1", "r2")
    event = AuditEvent.objects.get(action="serving.revision")
    assert event.before == {"model_revision": "r1"} and event.after == {"model_revision": "r2"}
    # the same attempt keeps running: a rollover, not a reschedule
    attempt.refresh_from_db()
    assert attempt.state in (Attempt.State.ADMITTED, Attempt.State.RUNNING)


def test_scaling_from_the_page_places_the_new_count() -> None:
    w = make_world()
    req = _serve(w.bob, w.vision)
    run_tick()
    first = req.attempts.get()
    old_pids = [r["pid"] for r in _replicas(first)]
    page = Client()
    page.force_login(w.bob)
    assert page.get(f"/requests/{req.pk}/serving/").status_code == 200
    bad = page.post(f"/requests/{req.pk}/serving/change/", {"replicas": "0"})
    assert bad.status_code == 400
    assert "replicas: Between 1 and 64 replicas." in bad.content.decode()
    # one replica per node: the pool has two
    bad = page.post(f"/requests/{req.pk}/serving/change/", {"replicas": "3"})
    assert bad.status_code == 400 and "replicas: At most 2 replicas" in bad.content.decode()
    bad = page.post(f"/requests/{req.pk}/serving/change/", {"model_revision": "a b"})
    assert bad.status_code == 400 and "model_revision: A revision is" in bad.content.decode()
    req.refresh_from_db()
    assert req.pods == 2
    # a member of another team may not scale it
    other = Client()
    other.force_login(w.carol)
    assert other.post(f"/requests/{req.pk}/serving/change/", {"replicas": "1"}).status_code == 404
    r = page.post(f"/requests/{req.pk}/serving/change/", {"replicas": "1"})
    assert r.status_code == 302
    req.refresh_from_db()
    first.refresh_from_db()
    assert req.pods == 1 and first.stop_reason == "rescale"
    assert AuditEvent.objects.get(action="serving.scale").after == {"replicas": 1}
    # the stopped replicas' servers are gone
    deadline = time.monotonic() + 5
    while any(serving_replicas.alive(p) for p in old_pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(serving_replicas.alive(p) for p in old_pids)
    from portal.tick.reconcile import reconcile

    reconcile()
    first.refresh_from_db()
    assert first.state == Attempt.State.PREEMPTED
    req.refresh_from_db()
    # back at once, and no step towards the requeue limit: scaling is the owner's choice
    assert req.state == GpuRequest.State.PENDING
    assert req.requeue_at is None and req.requeue_count == 0
    run_tick()
    second = req.attempts.get(number=2)
    assert len(second.nodes) == 1
    assert len(_replicas(second)) == 1


def test_a_replicas_log_says_what_it_serves() -> None:
    w = make_world()
    req = _serve(w.bob, w.vision, replicas=1)
    run_tick()
    time.sleep(1.2)  # a simulated workload starts a moment after it is created
    api = Client()
    api.force_login(w.bob)
    body = api.get(f"/requests/{req.pk}/logs/").content.decode()
    assert "serving meta-llama/Llama-3.1-8B-Instruct revision r1 with vllm" in body
    assert "loss" not in body


def test_a_saturated_workload_is_flagged_on_its_team_page() -> None:
    """High utilization with rising latency is not healthy."""
    from datetime import timedelta

    from django.utils import timezone

    w = make_world()
    req = _serve(w.bob, w.vision, replicas=1)
    run_tick()
    GpuRequest.objects.filter(pk=req.pk).update(state=GpuRequest.State.RUNNING)
    now = timezone.now()
    for i in range(12):
        ServingSample.objects.create(
            request=req,
            at=now - timedelta(minutes=12 - i),
            model_revision="r1",
            ttft_p95_seconds=0.2 + i * 0.2,
            gpu_utilization=96,
        )
    c = Client()
    c.force_login(w.bob)
    body = c.get(f"/teams/{w.vision.pk}/history/").content.decode()
    assert 'class="health saturated"' in body
    # Once, in the page: not also in the page's <title>.
    assert body.count('data-testid="serving-health"') == 1
    assert (
        re.search(r"<title>([^<]*)</title>", body)[1] == "Team vision: utilization · Quartermaster"
    )
    ServingSample.objects.filter(request=req).update(ttft_p95_seconds=0.2)
    body = c.get(f"/teams/{w.vision.pk}/history/").content.decode()
    assert 'class="health ok"' in body


def test_the_submit_form_starts_a_serving_workload_and_names_a_bad_field() -> None:
    from portal.models import DeviceProfile, Pool, WorkloadClass

    w = make_world()
    page = Client()
    page.force_login(w.bob)
    fields = {
        "team": w.vision.pk,
        "workload_class": WorkloadClass.objects.get(name="inference").pk,
        "pool": Pool.objects.get(name="h100-mig").pk,
        "profile": DeviceProfile.objects.get(name="mig-1g.10gb").pk,
        "count": 1,
        "pods": 2,
        "image": "vllm/vllm-openai:v0.6.3",
        "checkpoint_interval_s": 0,
        "max_runtime_s": 0,
        "estimated_runtime_s": 3600,
        "kind": "serving",
        "model_name": "llama",
        "model_revision": "r1",
        "runtime": "",
    }
    bad = page.post("/requests/new/", fields)
    assert bad.status_code == 400 and "Choose one of vllm, tgi, triton." in bad.content.decode()
    assert not GpuRequest.objects.exists()
    r = page.post("/requests/new/", {**fields, "runtime": "vllm"})
    assert r.status_code == 302, r.content.decode()[-2000:]
    req = GpuRequest.objects.get()
    assert (req.kind, req.model_revision, req.runtime, req.pods) == ("serving", "r1", "vllm", 2)


def test_start_estimates_never_expect_a_serving_workloads_devices_back() -> None:
    from portal.tick.estimates import running_ends

    w = make_world()
    _serve(w.bob, w.vision, replicas=1)
    submit(w.bob, w.vision)
    run_tick()
    ends = running_ends()
    assert len(ends) == 1  # the training request only
