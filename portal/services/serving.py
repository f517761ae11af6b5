"""Serving workloads: scale the replicas, change the model revision (docs/serving.md).

Both are changes to a request, made by its owner or a lead of its team (the caller
checks access per object) and audited. A revision change on a running workload rolls
its replicas over in place (the backend's `rollout`); a replica count change stops the
running attempt and requeues the request, so that the scheduling core places the new
count of replicas (with the `spread` policy, against quota and the inference floor).
"""

from __future__ import annotations

import logging
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from portal.backends import get_backend
from portal.models import Attempt, Decision, GpuRequest, Pool, RevisionChange
from portal.services import serving_spec
from portal.services.attempts import RESCALE, attempt_stop
from portal.services.audit import audit

log = logging.getLogger(__name__)


def _locked_serving(gpu_request: GpuRequest) -> GpuRequest:
    req = GpuRequest.objects.select_for_update().get(pk=gpu_request.pk)
    if req.kind != GpuRequest.Kind.SERVING:
        raise ValidationError({"kind": "Only a serving workload has replicas and a revision."})
    if req.state in GpuRequest.TERMINAL_STATES:
        raise ValidationError({"state": f"This workload has already {req.state}."})
    return req


def serving_scale(*, user: Any, gpu_request: GpuRequest, replicas: Any) -> GpuRequest:
    """Set the replica count; a running workload is requeued to place the new count."""
    replicas = serving_spec.check_replicas(replicas)
    with transaction.atomic():
        req = _locked_serving(gpu_request)
        before = req.pods
        if replicas == before:
            return req
        _check_room(req, replicas)
        req.pods = replicas
        req.save(update_fields=["pods", "updated_at"])
        attempt = req.attempts.filter(state__in=Attempt.ACTIVE_STATES).first()
        if attempt is not None:
            attempt_stop(attempt, reason=RESCALE)
        Decision.objects.create(
            request=req,
            team=req.team,
            kind=Decision.Kind.REQUEUE if attempt is not None else Decision.Kind.WAIT,
            code="rescale",
            message=f"replicas {before} -> {replicas}"
            + ("; the workload is placed again" if attempt is not None else ""),
        )
        audit(
            actor=user,
            action="serving.scale",
            obj=req,
            team=req.team,
            before={"replicas": before},
            after={"replicas": replicas},
        )
    return req


def _check_room(req: GpuRequest, replicas: int) -> None:
    """One replica per node (the core places them like a gang, on distinct nodes)."""
    pools = Pool.offering(req.pool)
    most = max((p.nodes.count() for p in pools), default=0)
    if replicas > most:
        where = f"pool {req.pool.name}" if req.pool else "any production pool"
        raise ValidationError(
            {"replicas": f"At most {most} replicas: one per node, and {where} has {most}."}
        )


def serving_set_revision(*, user: Any, gpu_request: GpuRequest, revision: Any) -> GpuRequest:
    """Change the model revision; running replicas roll over to it one by one."""
    if not isinstance(revision, str):
        raise ValidationError({"model_revision": "A revision is a string."})
    revision = serving_spec.check_revision(revision)
    with transaction.atomic():
        req = _locked_serving(gpu_request)
        before = req.model_revision
        if revision == before:
            return req
        req.model_revision = revision
        req.save(update_fields=["model_revision", "updated_at"])
        RevisionChange.objects.create(request=req, before=before, after=revision, at=timezone.now())
        audit(
            actor=user,
            action="serving.revision",
            obj=req,
            team=req.team,
            before={"model_revision": before},
            after={"model_revision": revision},
        )
        attempt = req.attempts.filter(state__in=Attempt.ACTIVE_STATES).first()
        if attempt is not None and attempt.state != Attempt.State.STOPPING:
            name, namespace, pods = attempt.workload_name, attempt.namespace, req.pods
            transaction.on_commit(lambda: _rollout(name, namespace, pods, revision))
    return req


def _rollout(name: str, namespace: str, pods: int, revision: str) -> None:
    try:
        get_backend().rollout(name, namespace, pods, revision)  # type: ignore[attr-defined]
    except Exception:
        # The workload keeps serving the old revision; the next change retries.
        log.exception("rollout of %s/%s to %s failed", namespace, name, revision)
