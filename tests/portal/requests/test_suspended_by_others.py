"""An admitted attempt whose Job another controller (Kueue) suspended: the request page and
the decision log say so once, instead of the request waiting silently."""

from __future__ import annotations

import pytest
from django.test import Client
from django.utils import timezone

from portal.backends.base import SUSPENDED_BY_OTHERS, Outcome, WorkloadStatus
from portal.models import Attempt, Decision, GpuRequest
from portal.services.attempts import SUSPENDED_CODE, attempt_observe
from tests.base import make_world, submit

pytestmark = pytest.mark.django_db

MESSAGE = "the Job was suspended by Kueue, not by Quartermaster"


def test_a_suspended_job_is_said_once_then_running_clears_it() -> None:
    w = make_world()
    req = submit(w.bob, w.vision)
    GpuRequest.objects.filter(pk=req.pk).update(state=GpuRequest.State.ADMITTED)
    attempt = Attempt.objects.create(
        request=req,
        number=1,
        state=Attempt.State.ADMITTED,
        pool=req.pool,
        nodes=["a100-01"],
        workload_name=f"qm-{req.pk}-1",
        namespace=req.team.namespace,
        gpus_milli=1000,
        admitted_at=timezone.now(),
    )
    held = WorkloadStatus(
        attempt.workload_name,
        attempt.namespace,
        Outcome.PENDING,
        SUSPENDED_BY_OTHERS,
        MESSAGE,
    )
    for _ in range(3):
        assert attempt_observe(attempt_id=attempt.pk, status=held) == "admitted"
    req.refresh_from_db()
    assert (req.status_code, req.status_message) == (SUSPENDED_CODE, MESSAGE)
    [decision] = Decision.objects.filter(request=req, code=SUSPENDED_CODE)
    assert decision.kind == Decision.Kind.WAIT and decision.attempt_id == attempt.pk
    assert decision.message == MESSAGE
    page = Client()
    page.force_login(w.bob)
    body = page.get(f"/requests/{req.pk}/").content.decode()
    assert MESSAGE in body
    running = WorkloadStatus(attempt.workload_name, attempt.namespace, Outcome.RUNNING)
    assert attempt_observe(attempt_id=attempt.pk, status=running) == "running"
    req.refresh_from_db()
    assert req.status_code == "running"
