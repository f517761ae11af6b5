"""Node validation (docs/lifecycle.md): a burn-in Job per node, its report judged and stored."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from portal.backends import get_backend
from portal.backends.base import ValidationSpec
from portal.lib import lifecycle
from portal.lib.readiness import attempt_token, ready_token_key
from portal.models import Allocation, Attempt, Node, Pool, Rollout, ValidationRun
from portal.services.audit import audit

log = logging.getLogger(__name__)

#: what acted, in the audit log, when the beat advances a rollout
#: the actor name of the audit events that validations and rollouts write
ACTOR = "rollout"


def site_thresholds() -> dict[str, float]:
    """The burn-in thresholds of the site's settings (VALIDATION_*; docs/lifecycle.md)."""
    return {
        **lifecycle.DEFAULT_THRESHOLDS,
        "nccl_busbw_gbps": float(settings.VALIDATION_NCCL_MIN_BUSBW_GBPS),
        "dcgm_diag_level": float(settings.VALIDATION_DCGM_DIAG_LEVEL),
    }


def _mig_resource(profile: str) -> str:
    return "nvidia.com/mig-" + profile.replace("+", ".")


def validation_spec(run: ValidationRun) -> ValidationSpec:
    """The burn-in of the run's node: every GPU (every MIG instance) it has."""
    devices = list(run.node.devices.all())
    counts: dict[str, int] = {}
    for d in devices:
        if d.partitioning == Pool.Partitioning.MIG:
            for m in d.mig_instances:
                key = _mig_resource(m["profile"])
                counts[key] = counts.get(key, 0) + 1
        else:
            counts["nvidia.com/gpu"] = counts.get("nvidia.com/gpu", 0) + max(1, d.replicas)
    base = settings.K8S_PORTAL_URL.rstrip("/")
    return ValidationSpec(
        name=run.name,
        namespace=settings.VALIDATION_NAMESPACE,
        node=run.node.name,
        resources=tuple(sorted(counts.items())),
        devices=len(devices),
        dcgm_level=int(run.thresholds.get("dcgm_diag_level", 1)),
        # The pod reports its figures like a checkpoint, with a token of its own.
        report_url=f"{base}/api/v1/validations/{run.pk}/result" if base else "",
        token=attempt_token(ready_token_key(), settings.VALIDATION_NAMESPACE, run.name, run.pk)
        if base
        else "",
    )


def cordon_node(node: Node, reason: str) -> None:
    """Cordon in the portal now, and on the cluster once the transaction commits."""
    node.cordoned = True
    node.maintenance_reason = reason[:300]
    node.save(update_fields=["cordoned", "maintenance_reason", "updated_at"])
    name = node.name
    transaction.on_commit(lambda: backend_node_patch(name, {}, True))


def uncordon_node(node: Node) -> None:
    node.cordoned = False
    node.maintenance_reason = ""
    node.save(update_fields=["cordoned", "maintenance_reason", "updated_at"])
    name = node.name
    transaction.on_commit(lambda: backend_node_patch(name, {}, False))


def backend_node_patch(
    name: str, labels: dict[str, str | None], unschedulable: bool | None
) -> bool:
    try:
        get_backend().node_patch(name, labels, unschedulable)
    except Exception:  # noqa: BLE001
        # The next step retries (a change not seen in the labels is written again).
        log.exception("patching node %s failed", name)
        return False
    return True


def validation_start(
    *,
    actor: User | None,
    node: Node,
    thresholds: Any = None,
    rollout: Rollout | None = None,
    now: datetime | None = None,
    reason: str = "validating",
    return_on_pass: bool = False,
) -> ValidationRun:
    """Cordon the node and start its burn-in. 400 (`node`) if one runs already. A pass
    uncordons a node the run cordoned, or any with `return_on_pass` (held out before)."""
    now = now or timezone.now()
    try:
        limits = lifecycle.thresholds_check(
            thresholds if thresholds is not None else (rollout.thresholds if rollout else None),
            site_thresholds(),
        )
    except ValueError as exc:
        raise ValidationError({"thresholds": str(exc)}) from exc
    with transaction.atomic():
        node = Node.objects.select_for_update().get(pk=node.pk)
        if node.validations.filter(state=ValidationRun.State.RUNNING).exists():
            raise ValidationError({"node": f"{node.name} is being validated already."})
        cordoned_it = not node.cordoned
        if cordoned_it or not node.maintenance_reason:
            cordon_node(node, reason)
        run = ValidationRun.objects.create(
            node=node,
            rollout=rollout,
            name="qm-validate",
            thresholds=limits,
            cordoned_it=(cordoned_it or return_on_pass) and rollout is None,
            created_by=actor if getattr(actor, "is_authenticated", False) else None,
            started_at=now,
        )
        run.name = f"qm-validate-{run.pk}"
        run.save(update_fields=["name"])
        audit(
            actor=actor,
            actor_name=ACTOR,
            action="node.validate",
            obj=run,
            after={"node": node.name, "thresholds": limits, "rollout": rollout and rollout.pk},
        )
        spec = validation_spec(run)
        transaction.on_commit(lambda: _launch(spec, now))
    return run


def pool_validate(*, actor: User, pool: Pool, thresholds: Any = None) -> list[ValidationRun]:
    """Validate every node of the pool that runs nothing now and is not being validated or
    rolled out (busy nodes are left in service: validate them when they drain)."""
    busy = set(
        Allocation.objects.filter(
            active=True, device__node__pool=pool, attempt__state__in=Attempt.ACTIVE_STATES
        ).values_list("device__node_id", flat=True)
    )
    if rollout_active_for(pool) is not None:
        raise ValidationError({"pool": f"A rollout is running on {pool.name}; it validates."})
    runs = []
    for node in pool.nodes.exclude(pk__in=busy).order_by("name"):
        if node.validations.filter(state=ValidationRun.State.RUNNING).exists():
            continue
        runs.append(validation_start(actor=actor, node=node, thresholds=thresholds))
    return runs


def _launch(spec: ValidationSpec, now: datetime) -> None:
    try:
        get_backend().validation_launch(spec, now)
    except Exception:  # noqa: BLE001
        log.exception("starting validation %s failed; the next step retries", spec.name)


def validation_report(*, run: ValidationRun, results: Any) -> ValidationRun:
    """Store the figures a burn-in pod reported (judged at the next step). 400 `results`."""
    if not isinstance(results, dict):
        raise ValidationError({"results": "Give the results as an object."})
    with transaction.atomic():
        run = ValidationRun.objects.select_for_update().get(pk=run.pk)
        if run.state != ValidationRun.State.RUNNING:
            raise ValidationError({"results": "This validation has finished."})
        run.results = {k: results[k] for k in sorted(results)[:20]}
        run.save(update_fields=["results"])
    return run


def validation_observe(run: ValidationRun, *, now: datetime | None = None) -> str:
    """Ask the backend how a running burn-in stands; judge and store it once done."""
    now = now or timezone.now()
    if run.state != ValidationRun.State.RUNNING:
        return run.state
    spec = validation_spec(run)
    error = ""
    results: dict[str, Any] = dict(run.results)
    if not results:
        try:
            status = get_backend().validation_status(spec, run.started_at)
        except Exception:  # noqa: BLE001
            log.exception("reading validation %s failed", run.name)
            return run.state
        if not status.done:
            if now - run.started_at > timedelta(seconds=settings.VALIDATION_TIMEOUT_SECONDS):
                error = f"no result within {settings.VALIDATION_TIMEOUT_SECONDS} s"
            else:
                if status.missing:
                    # Its launch was lost (it runs after commit): start it again.
                    _launch(spec, run.started_at)
                return run.state
        results, error = dict(status.results), error or status.error
    if error:
        passed, reason = False, error
    else:
        passed, reason = lifecycle.verdict(results, run.thresholds, spec.devices)
    with transaction.atomic():
        run = ValidationRun.objects.select_for_update().select_related("node").get(pk=run.pk)
        if run.state != ValidationRun.State.RUNNING:
            return run.state
        run.state = ValidationRun.State.PASSED if passed else ValidationRun.State.FAILED
        run.results, run.reason, run.finished_at = results, reason[:300], now
        run.save(update_fields=["state", "results", "reason", "finished_at"])
        node = Node.objects.select_for_update().get(pk=run.node_id)
        if not passed:
            # A failing node stays cordoned, with the reason, until an admin returns it.
            cordon_node(node, f"validation failed: {reason}")
        elif run.cordoned_it:
            uncordon_node(node)
        elif run.rollout_id is None and node.maintenance_reason == "validating":
            node.maintenance_reason = ""
            node.save(update_fields=["maintenance_reason", "updated_at"])
        audit(
            actor=None,
            actor_name=ACTOR,
            action=f"validation.{run.state}",
            obj=run,
            after={"node": node.name, "results": results, "reason": run.reason},
        )
    transaction.on_commit(lambda: _stop_validation(spec))
    return run.state


def _stop_validation(spec: ValidationSpec) -> None:
    try:
        get_backend().validation_stop(spec)
    except Exception:  # noqa: BLE001
        log.exception("deleting validation %s failed", spec.name)


def rollout_active_for(pool: Pool) -> Rollout | None:
    return Rollout.objects.filter(pool=pool, state=Rollout.State.RUNNING).first()
