"""Rollouts in waves (docs/lifecycle.md): plan, start, the step the beat runs, drains and halts."""

from __future__ import annotations

import logging
import re
from datetime import datetime
from typing import Any

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from portal.backends import get_backend
from portal.lib import lifecycle
from portal.models import (
    Allocation,
    Attempt,
    Decision,
    Node,
    Pool,
    Rollout,
    RolloutNode,
    ValidationRun,
)
from portal.services.attempts import attempt_stop, lost_work
from portal.services.audit import audit
from portal.services.nodes import BURN_IN_GATE, inventory_sync
from portal.services.pools import pool_update
from portal.services.validations import (
    ACTOR,
    backend_node_patch,
    cordon_node,
    site_thresholds,
    uncordon_node,
    validation_observe,
    validation_start,
)

log = logging.getLogger(__name__)

#: what acted, in the audit log, when the beat advances a rollout
_TARGET = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


def _node_milli(node: Node) -> int:
    return 1000 * node.devices.count()


def canary_pool_nodes(pool: Pool, kind: str) -> list[Node]:
    """The nodes of the pools marked canary (other than `pool`): wave 0 of every rollout but
    a MIG re-layout (that one is the pool's own geometry)."""
    if kind == "mig-layout" or pool.lifecycle == Pool.Lifecycle.CANARY:
        return []
    return list(
        Node.objects.filter(pool__lifecycle=Pool.Lifecycle.CANARY, pool__retired_at__isnull=True)
        .exclude(pool=pool)
        .prefetch_related("devices")
        .order_by("name")
    )


def rollout_plan(
    pool: Pool, *, canary_nodes: int, wave_percent: int, kind: str = "driver"
) -> tuple[list[list[str]], list[dict[str, Any]]]:
    """The waves and their capacity impact: GPU milli out of service per wave, and the share
    of the pool's GPUs that is (waves run one at a time, so this is also the peak). The canary
    pool's nodes, where a pool is marked canary, come first as a wave of their own."""
    nodes = {n.name: n for n in pool.nodes.prefetch_related("devices")}
    waves = lifecycle.plan_waves(list(nodes), canary=canary_nodes, wave_percent=wave_percent)
    canary_pool = canary_pool_nodes(pool, kind) if waves else []
    if canary_pool:
        waves = [[n.name for n in canary_pool], *waves]
        nodes.update({n.name: n for n in canary_pool})
    total = sum(_node_milli(n) for n in nodes.values()) or 1
    impact = []
    for i, wave in enumerate(waves):
        out = sum(_node_milli(nodes[n]) for n in wave)
        busy = (
            Allocation.objects.filter(
                active=True, device__node__name__in=wave, attempt__state__in=Attempt.ACTIVE_STATES
            )
            .values("attempt_id")
            .distinct()
            .count()
        )
        impact.append(
            {
                "wave": i,
                "canary": i == 0 and (canary_nodes > 0 or bool(canary_pool)),
                "canary_pool": i == 0 and bool(canary_pool),
                "nodes": wave,
                "gpu_milli_out": out,
                "pool_share_pct": round(100 * out / total, 1),
                "attempts_to_drain": busy,
            }
        )
    return waves, impact


def _check(kind: str, target: str, pool: Pool, fields: dict[str, Any]) -> dict[str, str]:
    errors: dict[str, str] = {}
    if kind not in lifecycle.KINDS:
        errors["kind"] = f"Choose one of {', '.join(lifecycle.KINDS)}."
    if not isinstance(target, str) or not _TARGET.match(target or ""):
        errors["target"] = (
            "Give the version or config name: letters, digits, '.', '-' and '_', up to 63."
        )
    if kind == "mig-layout" and pool.partitioning != Pool.Partitioning.MIG:
        errors["kind"] = f"Pool {pool.name} is not partitioned with MIG."
    bounds = {
        "canary_nodes": (0, 1000),
        "wave_percent": (1, 100),
        "max_failed_nodes": (0, 1000),
        "drain_timeout_s": (0, 7 * 86400),
        "apply_timeout_s": (1, 86400),
    }
    for name, (lo, hi) in bounds.items():
        v = fields[name]
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            errors[name] = f"A whole number from {lo} to {hi}."
    return errors


def rollout_start(
    *,
    actor: User,
    pool: Pool,
    kind: str,
    target: str,
    canary_nodes: int = 1,
    wave_percent: int = 25,
    max_failed_nodes: int = 0,
    drain_timeout_s: int = 3600,
    apply_timeout_s: int = 900,
    thresholds: Any = None,
) -> Rollout:
    """Plan and start a rollout (audited). ValidationError naming the field on bad input."""
    fields = {
        "canary_nodes": canary_nodes,
        "wave_percent": wave_percent,
        "max_failed_nodes": max_failed_nodes,
        "drain_timeout_s": drain_timeout_s,
        "apply_timeout_s": apply_timeout_s,
    }
    errors = _check(kind, target, pool, fields)
    try:
        limits = lifecycle.thresholds_check(thresholds, site_thresholds())
    except ValueError as exc:
        errors["thresholds"] = str(exc)
    if errors:
        raise ValidationError(errors)
    waves, impact = rollout_plan(
        pool, canary_nodes=canary_nodes, wave_percent=wave_percent, kind=kind
    )
    if not waves:
        raise ValidationError({"pool": f"Pool {pool.name} has no nodes."})
    names = [n for wave in waves for n in wave]
    taken = (
        RolloutNode.objects.filter(node__name__in=names, rollout__state=Rollout.State.RUNNING)
        .values_list("node__name", flat=True)
        .first()
    )
    if taken:
        raise ValidationError({"pool": f"Node {taken} is in a running rollout already."})
    extra: dict[str, Any] = {}
    if kind in lifecycle.OPERATOR_KINDS:
        try:
            extra["driver_api"] = get_backend().driver_api_in_use()
        except Exception as exc:  # noqa: BLE001 - the start is refused, with why
            log.exception("asking which GPU Operator driver API to use failed")
            raise ValidationError(
                {
                    "kind": f"Could not ask the cluster which driver API the GPU Operator serves: {exc}"
                }
            ) from exc
    change = lifecycle.change_for(kind, target, extra.get("driver_api", "labels"))
    values = [n.labels.get(change.converged_label, "") for n in pool.nodes.all() if n.labels] or [
        ""
    ]
    previous = max(set(values), key=lambda v: (values.count(v), v))
    if kind == "mig-layout":
        previous = max({n.labels.get(lifecycle.MIG_CONFIG, "") for n in pool.nodes.all()} or {""})
    try:
        with transaction.atomic():
            rollout = Rollout.objects.create(
                pool=pool,
                kind=kind,
                target=target,
                thresholds=limits,
                waves=waves,
                impact={"waves": impact, **extra},
                rollback_criteria=lifecycle.rollback_criteria(
                    kind, max_failed_nodes, target, previous
                ),
                created_by=actor,
                **fields,
            )
            nodes = {n.name: n for n in Node.objects.filter(name__in=names)}
            RolloutNode.objects.bulk_create(
                RolloutNode(rollout=rollout, node=nodes[name], wave=i)
                for i, wave in enumerate(waves)
                for name in wave
            )
            audit(
                actor=actor,
                action="rollout.start",
                obj=rollout,
                after={
                    "pool": pool.name,
                    "kind": kind,
                    "target": target,
                    "waves": waves,
                    **extra,
                    **fields,
                    "thresholds": limits,
                },
            )
    except IntegrityError as exc:
        raise ValidationError({"pool": f"A rollout is running on {pool.name} already."}) from exc
    return rollout


def rollouts_advance(*, now: datetime | None = None) -> dict[str, int]:
    """Advance every running rollout by one step per node; also judge lone validations."""
    now = now or timezone.now()
    counts = {"rollouts": 0, "validations": 0}
    for run in (
        ValidationRun.objects.filter(state=ValidationRun.State.RUNNING)
        .exclude(rollout__state=Rollout.State.RUNNING)
        .select_related("node")
    ):
        # Lone validations, and those a halted rollout left running.
        validation_observe(run, now=now)
        counts["validations"] += 1
    counts["burn_ins"] = burn_ins_start(now=now)
    running = list(Rollout.objects.filter(state=Rollout.State.RUNNING).select_related("pool"))
    if any(
        r.members.filter(wave=r.current_wave, step=RolloutNode.Step.APPLYING).exists()
        for r in running
    ):
        # The labels that show a change took come with the inventory.
        try:
            inventory_sync()
        except Exception:  # noqa: BLE001
            log.exception("inventory sync for the rollouts failed")
    for rollout in running:
        _advance(rollout, now)
        counts["rollouts"] += 1
    return counts


def burn_ins_start(*, now: datetime | None = None) -> int:
    """Start the burn-in of each node held out of its pool until it passes one (new, moved
    in, or back after a long absence: `portal.services.nodes`), where none runs yet."""
    started = 0
    held = Node.objects.filter(cordoned=True, maintenance_reason__startswith=BURN_IN_GATE).exclude(
        validations__state=ValidationRun.State.RUNNING
    )
    for node in held:
        try:
            validation_start(actor=None, node=node, now=now, return_on_pass=True)
        except ValidationError:  # one started meanwhile
            continue
        started += 1
    return started


def _audit(rollout: Rollout, action: str, **after: Any) -> None:
    audit(actor=None, actor_name=ACTOR, action=action, obj=rollout, after=after)


def _advance(rollout: Rollout, now: datetime) -> None:
    members = list(
        rollout.members.filter(wave=rollout.current_wave).select_related("node", "validation")
    )
    for m in members:
        if m.step not in RolloutNode.DONE:
            _step(rollout, m, now)
    if any(m.step not in RolloutNode.DONE for m in members):
        return
    with transaction.atomic():
        rollout = Rollout.objects.select_for_update().get(pk=rollout.pk)
        if rollout.state != Rollout.State.RUNNING:
            return
        failed = rollout.members.filter(step=RolloutNode.Step.FAILED).count()
        wave = rollout.current_wave
        if failed > rollout.max_failed_nodes:
            rollout.state = Rollout.State.HALTED
            rollout.halt_reason = (
                f"{failed} node(s) failed, more than the {rollout.max_failed_nodes} allowed; "
                f"halted after wave {wave}"
            )
            rollout.finished_at = now
            rollout.save(update_fields=["state", "halt_reason", "finished_at"])
            _audit(rollout, "rollout.halt", wave=wave, failed=failed, reason=rollout.halt_reason)
        elif wave + 1 < len(rollout.waves):
            rollout.current_wave = wave + 1
            rollout.save(update_fields=["current_wave"])
            _audit(rollout, "rollout.wave", wave=wave + 1, nodes=rollout.waves[wave + 1])
        else:
            rollout.state = Rollout.State.SUCCEEDED
            rollout.finished_at = now
            rollout.save(update_fields=["state", "finished_at"])
            _audit(rollout, "rollout.succeed", failed=failed)
            layout = rollout.impact.get("mig_layout")
            if rollout.kind == Rollout.Kind.MIG_LAYOUT and layout:
                # Every node runs the new layout: the pool offers its profiles from now on.
                pool_update(actor=None, pool=rollout.pool, mig_layout=layout)


def _move(m: RolloutNode, step: str, now: datetime, reason: str = "") -> None:
    m.step, m.reason, m.step_at = step, reason[:300], now
    m.save(update_fields=["step", "reason", "step_at", "previous", "stopped_attempts"])


def _step(rollout: Rollout, m: RolloutNode, now: datetime) -> None:
    with transaction.atomic():
        m = RolloutNode.objects.select_for_update().select_related("node").get(pk=m.pk)
        node = m.node
        if m.step == RolloutNode.Step.WAITING:
            cordon_node(node, f"rollout {rollout.pk}: {rollout.kind} {rollout.target}")
            _move(m, RolloutNode.Step.DRAINING, now)
            _audit(rollout, "rollout.cordon", node=node.name, wave=m.wave)
            _decide(rollout, m, "rollout-cordon", "cordoned for the GPU Operator's driver upgrade")
        elif m.step == RolloutNode.Step.DRAINING:
            _drain(rollout, m, now)
        elif m.step == RolloutNode.Step.APPLYING:
            _apply(rollout, m, now)
        elif m.step == RolloutNode.Step.VALIDATING:
            _validate(rollout, m, now)


def _active_attempts(node: Node) -> list[Attempt]:
    ids = Allocation.objects.filter(device__node=node, active=True).values_list(
        "attempt_id", flat=True
    )
    return list(
        Attempt.objects.filter(pk__in=set(ids), state__in=Attempt.ACTIVE_STATES).select_related(
            "request__workload_class"
        )
    )


def drain_verdict(attempt: Attempt, since: datetime, now: datetime) -> str:
    """ "stop" when the attempt may be stopped now without losing more than the work since its
    last checkpoint; otherwise why it is waited for."""
    req = attempt.request
    begun = attempt.started_at or attempt.admitted_at
    min_runtime = req.workload_class.min_runtime_s
    if (now - begun).total_seconds() < min_runtime:
        return f"waiting for {attempt.workload_name} to run its minimum {min_runtime} s"
    interval = req.checkpoint_interval_s
    if interval <= 0:
        return f"waiting for {attempt.workload_name} to finish (it does not checkpoint)"
    last = attempt.last_checkpoint_at
    if last is None:
        return f"waiting for {attempt.workload_name}'s first checkpoint"
    # Checkpoint-aware: stop right after a fresh checkpoint, or once one interval has passed.
    if last >= since or (now - since).total_seconds() >= interval:
        return "stop"
    return f"waiting for {attempt.workload_name}'s next checkpoint"


def _decide(rollout: Rollout, m: RolloutNode, code: str, message: str) -> None:
    """The portal's cordon and drain for a driver upgrade the GPU Operator carries out, in
    the decision log beside the requeues of the work it stopped (the Operator's own
    cordon and drain then find nothing to do)."""
    if rollout.kind != Rollout.Kind.DRIVER or _driver_api(rollout) not in lifecycle.OPERATOR_APIS:
        return
    Decision.objects.create(
        node=m.node.name,
        pool_id=m.node.pool_id,
        kind=Decision.Kind.END,
        code=code,
        message=f"{m.node.name}: {message} to {rollout.target} (rollout {rollout.pk})"[:500],
        facts={"rollout": rollout.pk, "wave": m.wave, "stopped": m.stopped_attempts},
    )


def _driver_api(rollout: Rollout) -> str:
    return str(rollout.impact.get("driver_api") or "labels")


def _change(rollout: Rollout, m: RolloutNode) -> lifecycle.Change:
    wave = lifecycle.driver_wave_name(rollout.pk, m.wave)
    return lifecycle.change_for(rollout.kind, rollout.target, _driver_api(rollout), wave)


def _drain(rollout: Rollout, m: RolloutNode, now: datetime) -> None:
    attempts = _active_attempts(m.node)
    since = m.step_at or now
    if not attempts:
        change = _change(rollout, m)
        m.previous = {k: m.node.labels.get(k) for k in change.labels}
        _move(m, RolloutNode.Step.APPLYING, now)
        _write_change(rollout, m)
        _decide(rollout, m, "rollout-drained", "drained; the GPU Operator upgrades the driver")
        _audit(
            rollout,
            "rollout.apply",
            node=m.node.name,
            labels=change.labels,
            previous=m.previous,
        )
        return
    waiting = []
    for attempt in attempts:
        if attempt.state == Attempt.State.STOPPING:
            waiting.append(f"{attempt.workload_name} is stopping")
            continue
        why = drain_verdict(attempt, since, now)
        if why != "stop":
            waiting.append(why)
            continue
        clause, lost = lost_work(attempt, now)
        attempt_stop(attempt, reason="drained")
        m.stopped_attempts = [*m.stopped_attempts, attempt.pk]
        _audit(
            rollout,
            "rollout.preempt",
            node=m.node.name,
            attempt=attempt.pk,
            request=attempt.request_id,
            lost=clause,
            **lost,
        )
        waiting.append(f"{attempt.workload_name} is stopping")
    if waiting and (now - since).total_seconds() > rollout.drain_timeout_s:
        reason = f"drain timed out after {rollout.drain_timeout_s} s: {waiting[0]}"
        _move(m, RolloutNode.Step.FAILED, now, reason)
        m.node.maintenance_reason = f"rollout {rollout.pk}: {reason}"[:300]
        m.node.save(update_fields=["maintenance_reason", "updated_at"])
        _audit(rollout, "rollout.node_failed", node=m.node.name, reason=reason)
        return
    m.reason = "; ".join(waiting)[:300]
    m.save(update_fields=["reason", "stopped_attempts"])


def _write_change(rollout: Rollout, m: RolloutNode) -> None:
    change = _change(rollout, m)
    name, labels = m.node.name, dict(change.labels)
    api = _driver_api(rollout)
    if rollout.kind == Rollout.Kind.DRIVER and api in lifecycle.OPERATOR_APIS:
        wave, target = lifecycle.driver_wave_name(rollout.pk, m.wave), rollout.target
        # The resource first: a node labelled for a wave nothing selects yet waits harmlessly.
        transaction.on_commit(lambda: _operator_write(api, wave, target))
    elif rollout.kind == Rollout.Kind.DEVICE_PLUGIN and api in lifecycle.OPERATOR_APIS:
        plugin = rollout.target
        transaction.on_commit(lambda: _plugin_write(plugin))
    transaction.on_commit(lambda: backend_node_patch(name, labels, None))


def _operator_write(api: str, name: str, version: str) -> None:
    try:
        get_backend().driver_version_write(api, name, version)
    except Exception:  # noqa: BLE001
        # Written again at the next step while the node waits for it.
        log.exception("writing driver %s through %s failed", version, api)


def _plugin_write(version: str) -> None:
    try:
        get_backend().device_plugin_version_write(version)
    except Exception:  # noqa: BLE001
        # Written again at the next step while the node waits for it.
        log.exception("writing device plugin %s to the ClusterPolicy failed", version)


def _plugin_runs(node: str, version: str) -> bool:
    """Whether the GPU Operator's device plugin on `node` runs `version` (its pod, Ready)."""
    try:
        running = get_backend().device_plugin_version(node)
    except Exception:  # noqa: BLE001
        # Asked again at the next step.
        log.exception("reading the device plugin on %s failed", node)
        return False
    return running == version or running.startswith(f"{version}-")


def _operator_converged(rollout: Rollout, m: RolloutNode, node: Node, now: datetime) -> bool:
    """Follow the GPU Operator's per-node upgrade state; True once the node may be burnt in.
    A node it reports `upgrade-failed` fails here, with that reason."""
    where, why = lifecycle.driver_upgrade(node.labels, rollout.target)
    if where == "done":
        return True
    if where == "failed":
        _move(m, RolloutNode.Step.FAILED, now, why)
        node.maintenance_reason = f"rollout {rollout.pk}: {why}"[:300]
        node.save(update_fields=["maintenance_reason", "updated_at"])
        _audit(rollout, "rollout.node_failed", node=node.name, reason=why)
        return False
    if m.reason != why[:300]:
        _audit(
            rollout,
            "rollout.upgrade_state",
            node=node.name,
            state=node.labels.get(lifecycle.DRIVER_UPGRADE_STATE, ""),
        )
    return False


def _apply(rollout: Rollout, m: RolloutNode, now: datetime) -> None:
    change = _change(rollout, m)
    node = Node.objects.get(pk=m.node_id)
    operator = (
        rollout.kind == Rollout.Kind.DRIVER and _driver_api(rollout) in lifecycle.OPERATOR_APIS
    )
    if operator:
        converged = _operator_converged(rollout, m, node, now)
        if m.step == RolloutNode.Step.FAILED:
            return
    else:
        converged = node.labels.get(change.converged_label) == change.converged_value
        if not converged and change.converged_label == lifecycle.DEVICE_PLUGIN_VERSION:
            converged = _plugin_runs(node.name, change.converged_value)
    if converged:
        run = validation_start(actor=None, node=node, rollout=rollout, now=now)
        m.validation = run
        m.save(update_fields=["validation"])
        _move(m, RolloutNode.Step.VALIDATING, now)
        _audit(rollout, "rollout.applied", node=node.name, validation=run.pk)
        return
    waited = (now - (m.step_at or now)).total_seconds()
    if waited > rollout.apply_timeout_s:
        shown = node.labels.get(change.converged_label, "(absent)")
        reason = (
            f"the change did not take within {rollout.apply_timeout_s} s: "
            f"{change.converged_label} is {shown}, not {change.converged_value}"
        )
        _move(m, RolloutNode.Step.FAILED, now, reason)
        node.maintenance_reason = f"rollout {rollout.pk}: {reason}"[:300]
        node.save(update_fields=["maintenance_reason", "updated_at"])
        _audit(rollout, "rollout.node_failed", node=node.name, reason=reason)
        return
    if operator:
        m.reason = lifecycle.driver_upgrade(node.labels, rollout.target)[1][:300]
    else:
        m.reason = f"waiting for {change.converged_label}={change.converged_value}"
    m.save(update_fields=["reason"])
    # Written again while waiting: a patch lost to a backend error is retried.
    _write_change(rollout, m)


def _validate(rollout: Rollout, m: RolloutNode, now: datetime) -> None:
    run = m.validation
    if run is None:
        _move(m, RolloutNode.Step.APPLYING, now)
        return
    state = validation_observe(run, now=now)
    if state == ValidationRun.State.RUNNING:
        m.reason = f"validation {run.name} running"
        m.save(update_fields=["reason"])
        return
    node = Node.objects.select_for_update().get(pk=m.node_id)
    if state == ValidationRun.State.PASSED:
        uncordon_node(node)
        _move(m, RolloutNode.Step.RETURNED, now)
        _audit(rollout, "rollout.return", node=node.name, validation=run.pk)
    else:
        run.refresh_from_db()
        reason = f"validation failed: {run.reason}"
        _move(m, RolloutNode.Step.FAILED, now, reason)
        node.maintenance_reason = f"rollout {rollout.pk}: {reason}"[:300]
        node.save(update_fields=["maintenance_reason", "updated_at"])
        _audit(rollout, "rollout.node_failed", node=node.name, reason=reason)


def mig_relayout_start(*, actor: User, pool: Pool, **options: Any) -> Rollout:
    """Roll the pool's proposed MIG layout out (`portal.services.mig_relayout`), where the pool allows
    it; on success the pool's `mig_layout` becomes it. 400 `pool` otherwise."""
    from portal.services import mig_relayout

    proposal = mig_relayout.proposal_for(pool)
    if proposal is None:
        raise ValidationError({"pool": f"No MIG layout to propose for {pool.name}."})
    if not proposal["allowed"]:
        raise ValidationError({"pool": f"Pool {pool.name} is not open to MIG re-layout."})
    if proposal["same"]:
        raise ValidationError({"pool": f"Pool {pool.name} runs the proposed layout already."})
    rollout = rollout_start(
        actor=actor, pool=pool, kind="mig-layout", target=proposal["config_name"], **options
    )
    rollout.impact = {**rollout.impact, "mig_layout": proposal["profiles"]}
    rollout.save(update_fields=["impact"])
    return rollout


def rollout_halt(*, actor: User, rollout: Rollout, reason: str = "") -> Rollout:
    """An admin stops a running rollout now (audited). Nodes it has taken stay cordoned with
    their reason; burn-ins under way finish and are recorded. 400 `state` if not running."""
    reason = str(reason or "")[:200]
    with transaction.atomic():
        rollout = Rollout.objects.select_for_update().get(pk=rollout.pk)
        if rollout.state != Rollout.State.RUNNING:
            raise ValidationError({"state": f"The rollout has {rollout.state} already."})
        who = getattr(actor, "get_username", lambda: "an admin")()
        rollout.state = Rollout.State.HALTED
        rollout.halt_reason = f"halted by {who} in wave {rollout.current_wave}" + (
            f": {reason}" if reason else ""
        )
        rollout.finished_at = timezone.now()
        rollout.save(update_fields=["state", "halt_reason", "finished_at"])
        audit(
            actor=actor,
            action="rollout.halt",
            obj=rollout,
            after={"wave": rollout.current_wave, "reason": rollout.halt_reason},
        )
    return rollout
