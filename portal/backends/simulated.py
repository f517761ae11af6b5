"""The simulated cluster: nodes from a YAML file, workloads that live in the database.

A workload starts a moment after it is created, runs for its simulated
duration and ends with its simulated exit code; a stopped one reports
PREEMPTED. Web, worker and beat are separate processes, so the workloads are
rows, not memory.

A request with a checkpoint interval gets a folder of its own under
SIMULATED_CHECKPOINT_DIR, kept across its attempts; its workload writes a
checkpoint file there at the interval (scaled like its runtime) and reports
the last one in its status, as a real workload would POST it.

Each workload also writes a log, a file under SIMULATED_LOG_DIR
(`<namespace>/<name>.log`): the lines a training script prints, one step per
wall second, ending as the workload ends (a traceback when it fails). Like the
checkpoints, the lines are written when the portal looks.
"""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml
from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from portal.backends import serving_replicas
from portal.backends.base import (
    DiscoveredNode,
    InventoryDevice,
    InventoryMig,
    InventoryNode,
    LaunchSpec,
    Outcome,
    ValidationSpec,
    ValidationStatus,
    WorkloadEvent,
    WorkloadStatus,
    checkpoint_claim,
    checkpoint_env,
    gang_status,
    member_name,
    rendezvous_env,
)
from portal.lib.bulk import insert_rows
from portal.models import SimulatedNode, SimulatedWorkload
from scheduling import mig

START_DELAY = timedelta(seconds=1)
#: a simulated workload prints at most this many step lines (one per wall second)
MAX_LOG_STEPS = 5000


def _names(name: str, pods: int) -> list[str]:
    return [member_name(name, r) for r in range(pods)] if pods > 1 else [name]


class ClusterFileError(ValueError):
    pass


def load_cluster(path: str | Path) -> dict[str, Any]:
    """Read and check a simulated-cluster YAML file."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ClusterFileError(f"{path}: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("pools"), list):
        raise ClusterFileError(f"{path}: expected a mapping with a 'pools' list")
    for pool in data["pools"]:
        for key in ("name", "gpu_model", "gpu_memory_mib", "nodes"):
            if key not in pool:
                raise ClusterFileError(f"{path}: pool {pool.get('name', '?')} lacks '{key}'")
    return data


def mig_instances(layout: list[str], model: str, memory_mib: int) -> tuple[InventoryMig, ...]:
    """Lay out MIG profiles on one device by NVIDIA's geometry for its GPU family."""
    family = mig.family_for(model, memory_mib)
    placed = mig.layout(family, layout) if family is not None else None
    if placed is None:
        raise ClusterFileError(f"MIG layout {layout} does not fit one {model} device")
    return tuple(InventoryMig(m.profile, m.start, m.size) for m in placed)


def inventory_from_file(path: str | Path) -> list[InventoryNode]:
    data = load_cluster(path)
    nodes: list[InventoryNode] = []
    for pool in data["pools"]:
        spec = pool["nodes"]
        partitioning = pool.get("partitioning", "exclusive")
        migs = (
            mig_instances(
                pool.get("mig_layout", []), pool["gpu_model"], int(pool["gpu_memory_mib"])
            )
            if partitioning == "mig"
            else ()
        )
        for i in range(int(spec.get("count", 1))):
            name = f"{spec.get('prefix', pool['name'])}-{i + 1:02d}"
            unhealthy = set(spec.get("unhealthy", {}).get(name, []))
            # Software labels (GFD, GPU Operator) for the whole pool, then per node (drift).
            extra = {**pool.get("labels", {}), **spec.get("labels", {}).get(name, {})}
            devices = tuple(
                InventoryDevice(
                    index=d,
                    model=pool["gpu_model"],
                    memory_mib=int(pool["gpu_memory_mib"]),
                    uuid=f"GPU-sim-{name}-{d}",
                    healthy=d not in unhealthy,
                    partitioning=partitioning,
                    replicas=int(pool.get("replicas", 1)),
                    mig_instances=migs,
                )
                for d in range(int(spec.get("gpus", 8)))
            )
            nodes.append(
                InventoryNode(
                    name=name,
                    pool=pool["name"],
                    cpu_milli=int(spec.get("cpu_milli", 64000)),
                    memory_mib=int(spec.get("memory_mib", 512 * 1024)),
                    devices=devices,
                    labels={
                        **gfd_labels(pool, len(devices)),
                        **{k: str(v) for k, v in extra.items()},
                        **pool.get("node_selector", {}),
                    },
                    taints=tuple(
                        (t["key"], t.get("value", ""), t.get("effect", "NoSchedule"))
                        for t in pool.get("taints", [])
                    ),
                    ready=name not in set(spec.get("not_ready", [])),
                    interconnect=pool.get("interconnect", "pcie"),
                )
            )
    return nodes


def gfd_labels(spec: dict[str, Any], gpus: int) -> dict[str, str]:
    """What GPU Feature Discovery would label a node of this spec with."""
    labels = {
        "nvidia.com/gpu.product": str(spec["gpu_model"]),
        "nvidia.com/gpu.memory": str(spec["gpu_memory_mib"]),
        "nvidia.com/gpu.count": str(gpus),
    }
    if spec.get("partitioning") == "mig":
        labels["nvidia.com/mig.strategy"] = "mixed"
    if int(spec.get("replicas", 1)) > 1:
        labels["nvidia.com/gpu.replicas"] = str(spec["replicas"])
    return labels


def unpooled_from_file(path: str | Path) -> list[DiscoveredNode]:
    """The file's GPU nodes that no pool of the demo owns (`unpooled:`), for discovery."""
    out = []
    for spec in load_cluster(path).get("unpooled", []):
        gpus = int(spec.get("gpus", 8))
        for i in range(int(spec.get("count", 1))):
            out.append(
                DiscoveredNode(
                    name=f"{spec['prefix']}-{i + 1:02d}",
                    labels={
                        **gfd_labels(spec, gpus),
                        **{k: str(v) for k, v in spec.get("labels", {}).items()},
                    },
                    gpus=gpus,
                )
            )
    return out


def checkpoint_every_s(interval_s: int) -> float:
    """A checkpoint interval in wall seconds, scaled as simulated runtimes are."""
    return max(1.0, interval_s * settings.SIMULATED_SECONDS_PER_HOUR / 3600)


class SimulatedBackend:
    name = "simulated"

    def __init__(self, path: str | Path, checkpoint_root: str | Path | None = None) -> None:
        self.path = Path(path)
        self._checkpoint_root = checkpoint_root

    @property
    def checkpoint_root(self) -> Path:
        return Path(self._checkpoint_root or settings.SIMULATED_CHECKPOINT_DIR)

    def checkpoint_dir(self, request_id: int) -> Path:
        return self.checkpoint_root / checkpoint_claim(request_id)

    def gpu_nodes(self) -> list[DiscoveredNode]:
        return [
            DiscoveredNode(
                name=n.name,
                labels=dict(n.labels),
                gpus=len(n.devices),
                taints=n.taints,
            )
            for n in self.inventory()
        ] + unpooled_from_file(self.path)

    def inventory(self) -> list[InventoryNode]:
        changed = {n.name: n for n in SimulatedNode.objects.all()}
        out = []
        for inv in inventory_from_file(self.path):
            sim = changed.get(inv.name)
            if sim is not None:
                labels = operators_act({**inv.labels, **sim.labels})
                inv = replace(
                    inv,
                    labels=labels,
                    cordoned=inv.cordoned or sim.unschedulable,
                    devices=_relaid(inv.devices, labels.get("nvidia.com/mig.config", "")),
                )
            out.append(inv)
        return out

    # -- node changes and burn-in (docs/lifecycle.md) ----------------------------------

    def node_patch(
        self, name: str, labels: dict[str, str | None], unschedulable: bool | None = None
    ) -> None:
        with transaction.atomic():
            sim, _ = SimulatedNode.objects.select_for_update().get_or_create(name=name)
            merged = {**sim.labels}
            for k, v in labels.items():
                # None removes: kept as None so that it hides a label the YAML file sets.
                merged[k] = v
            sim.labels = {k: v for k, v in merged.items()}
            if unschedulable is not None:
                sim.unschedulable = unschedulable
            sim.save()

    def validation_launch(self, spec: ValidationSpec, started_at: datetime) -> None:
        # Nothing runs: the results are worked out from the cluster file when asked for.
        return None

    def validation_status(self, spec: ValidationSpec, started_at: datetime) -> ValidationStatus:
        if timezone.now() < started_at + timedelta(seconds=settings.SIMULATED_VALIDATION_SECONDS):
            return ValidationStatus(done=False)
        return ValidationStatus(done=True, results=simulated_results(self.path, spec))

    def validation_stop(self, spec: ValidationSpec) -> None:
        return None

    def driver_api_in_use(self) -> str:
        # No GPU Operator here: the node labels are the whole change.
        return "labels"

    def driver_version_write(self, api: str, name: str, version: str) -> None:
        return None

    def device_plugin_version_write(self, version: str) -> None:
        return None

    def device_plugin_version(self, node: str) -> str:
        return ""

    def _checkpointing(self, spec: LaunchSpec) -> tuple[tuple[tuple[str, str], ...], float]:
        """The checkpoint env of a spec's pods and their interval in wall seconds (none: 0)."""
        if spec.checkpoint_interval_s <= 0:
            return (), 0
        # One folder per request, created if missing: a retry finds its predecessor's.
        folder = self.checkpoint_dir(spec.request_id)
        folder.mkdir(parents=True, exist_ok=True)
        return checkpoint_env(spec, str(folder)), checkpoint_every_s(spec.checkpoint_interval_s)

    def launch(self, spec: LaunchSpec) -> None:
        """One workload per pod: a gang of N runs N workloads, each on its own node."""
        now = timezone.now()
        ckpt_env, every = self._checkpointing(spec)
        for member in spec.members():
            if SimulatedWorkload.objects.filter(
                name=member.name, namespace=member.namespace
            ).exists():
                continue  # created before: a retried launch adopts it
            row = _with_server(_workload(member, now, ckpt_env, every))
            try:
                with transaction.atomic():
                    SimulatedWorkload.objects.create(**row)
            except IntegrityError:
                # Created before: a retried launch adopts it.
                pass

    def launch_many(self, specs: list[LaunchSpec]) -> None:
        """`launch` for each spec, in bulk inserts (the tick launches all it admitted at once)."""
        now = timezone.now()
        rows = []
        for spec in specs:
            ckpt_env, every = self._checkpointing(spec)
            rows += [_workload(member, now, ckpt_env, every) for member in spec.members()]
        if any(r["spec"].get("serving") for r in rows):
            # Only new replicas start a server: a retried launch adopts the running one.
            have = set(
                SimulatedWorkload.objects.filter(
                    name__in=[r["name"] for r in rows if r["spec"].get("serving")]
                ).values_list("namespace", "name")
            )
            rows = [r if (r["namespace"], r["name"]) in have else _with_server(r) for r in rows]
        insert_rows(
            SimulatedWorkload,
            rows,
            # Created before: a retried launch adopts it.
            ignore_conflicts=True,
        )

    def stop(self, name: str, namespace: str, grace_seconds: int = 30, pods: int = 1) -> None:
        rows = SimulatedWorkload.objects.filter(
            name__in=_names(name, pods), namespace=namespace, stopped_at__isnull=True
        )
        for spec in rows.values_list("spec", flat=True):
            serving_replicas.stop(spec.get("serving"))
        rows.update(stopped_at=timezone.now())

    def rollout(self, name: str, namespace: str, pods: int, revision: str) -> None:
        """Roll a serving workload's replicas over to `revision`, one after another: each
        restarts with it and is ready again once it has warmed up."""
        for w in SimulatedWorkload.objects.filter(
            name__in=_names(name, pods), namespace=namespace, stopped_at__isnull=True
        ).order_by("name"):
            serving = w.spec.get("serving")
            if not serving or serving.get("revision") == revision:
                continue
            serving_replicas.stop(serving)
            w.spec["serving"] = serving_replicas.start({**serving, "revision": revision})
            w.save(update_fields=["spec"])

    def serving_replicas(self, name: str, namespace: str, pods: int = 1) -> list[dict[str, Any]]:
        """The live replicas of a serving workload (their `serving` spec: port, revision …).

        A replica whose server process is gone is started again, as a Deployment would."""
        out = []
        for w in SimulatedWorkload.objects.filter(
            name__in=_names(name, pods), namespace=namespace, stopped_at__isnull=True
        ).order_by("name"):
            serving = w.spec.get("serving")
            if not serving or not settings.SIMULATED_SERVING_PROCESSES:
                continue
            if not serving_replicas.alive(int(serving.get("pid") or 0)):
                w.spec["serving"] = serving = serving_replicas.start(serving)
                w.save(update_fields=["spec"])
            out.append(serving)
        return out

    def checkpoints_delete(self, request_id: int, namespace: str) -> None:
        shutil.rmtree(self.checkpoint_dir(request_id), ignore_errors=True)

    def status(self, name: str, namespace: str, pods: int = 1) -> WorkloadStatus:
        if pods > 1:
            members = [self._status(n, namespace) for n in _names(name, pods)]
            # Rank 0 checkpoints for the gang, as training frameworks do.
            return replace(
                gang_status(name, namespace, members),
                last_checkpoint_at=members[0].last_checkpoint_at,
            )
        return self._status(name, namespace)

    def _status(self, name: str, namespace: str) -> WorkloadStatus:
        w = SimulatedWorkload.objects.filter(name=name, namespace=namespace).first()
        if w is None:
            return WorkloadStatus(name, namespace, Outcome.MISSING)
        self._write_log(w)
        return replace(self._outcome(w, name, namespace), last_checkpoint_at=self._checkpoint(w))

    # -- logs and events -------------------------------------------------------------

    @property
    def log_root(self) -> Path:
        return Path(settings.SIMULATED_LOG_DIR)

    def log_path(self, name: str, namespace: str) -> Path:
        return self.log_root / namespace / f"{name}.log"

    def logs(
        self, name: str, namespace: str, tail_lines: int = 200, pods: int = 1, pod: int = 0
    ) -> str:
        member = _names(name, pods)[pod]
        w = SimulatedWorkload.objects.filter(name=member, namespace=namespace).first()
        if w is not None:
            self._write_log(w)
        try:
            lines = self.log_path(member, namespace).read_text().splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-tail_lines:]) + ("\n" if lines else "")

    def events(self, name: str, namespace: str, pods: int = 1) -> list[WorkloadEvent]:
        rows = SimulatedWorkload.objects.filter(name__in=_names(name, pods), namespace=namespace)
        events = [e for w in rows for e in _workload_events(w, timezone.now())]
        return sorted(events, key=lambda e: (e.at or w_never, e.object))

    def _write_log(self, w: SimulatedWorkload) -> None:
        lines = log_lines(w, timezone.now())
        path = self.log_path(w.name, w.namespace)
        try:
            if path.exists() and path.stat().st_size == sum(len(x) + 1 for x in lines):
                return
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(f"{x}\n" for x in lines))
        except OSError:
            # A read-only or full disk loses the log, not the demo.
            pass

    def _checkpoint(self, w: SimulatedWorkload) -> datetime | None:
        """Write the checkpoints the workload has finished by now; return the last one's time.

        The workload checkpoints every `checkpoint_every_s` from its start until it ends
        or is stopped. Files are written when the portal looks, with the time each was due.
        """
        every = float(w.spec.get("checkpoint_every_s") or 0)
        folder = w.spec.get("env", {}).get("QM_CHECKPOINT_DIR")
        if every <= 0 or not folder:
            return None
        until = min(timezone.now(), w.ends_at, w.stopped_at or w.ends_at)
        done = int((until - w.starts_at).total_seconds() // every)
        if done < 1:
            return None
        at = w.starts_at + timedelta(seconds=done * every)
        path = Path(folder) / f"{w.name}-{done:06d}.json"
        if not path.exists():
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(
                    json.dumps({"workload": w.name, "checkpoint": done, "at": at.isoformat()})
                )
            except OSError:
                # A read-only or full disk loses the file, not the demo.
                return None
        return at

    def _outcome(self, w: SimulatedWorkload, name: str, namespace: str) -> WorkloadStatus:
        now = timezone.now()
        if w.stopped_at is not None:
            return WorkloadStatus(
                name, namespace, Outcome.PREEMPTED, "Deleted", "stopped by the portal"
            )
        if now < w.starts_at:
            return WorkloadStatus(name, namespace, Outcome.PENDING)
        if now < w.ends_at:
            return WorkloadStatus(name, namespace, Outcome.RUNNING)
        if w.exit_code == 0:
            return WorkloadStatus(name, namespace, Outcome.SUCCEEDED, "Completed", exit_code=0)
        return WorkloadStatus(
            name,
            namespace,
            Outcome.FAILED,
            "Error",
            f"exited with code {w.exit_code}",
            exit_code=w.exit_code,
        )


def _workload(
    member: LaunchSpec, now: datetime, ckpt_env: tuple[tuple[str, str], ...], every: float
) -> dict[str, Any]:
    """The SimulatedWorkload row of one pod; `ckpt_env` and `every` from `_checkpointing`."""
    return {
        "name": member.name,
        "namespace": member.namespace,
        "node": member.node,
        "spec": {
            "image": member.image,
            "command": list(member.command),
            "attempt": member.attempt_id,
            "env": dict(rendezvous_env(member) + ckpt_env),
            "devices": [g.device for g in member.grants],
            "checkpoint_every_s": every,
            "serving": serving_replicas.serving_fields(member),
        },
        "created_at": now,
        "starts_at": now + START_DELAY,
        # a serving workload runs until stopped
        "ends_at": now
        + START_DELAY
        + (
            SERVING_RUNS_FOR
            if member.serving is not None
            else timedelta(seconds=max(1, member.simulated_duration_s))
        ),
        "exit_code": member.simulated_exit_code,
    }


def _with_server(row: dict[str, Any]) -> dict[str, Any]:
    """A replica's row with its server process started (rows of other workloads unchanged)."""
    serving = row["spec"].get("serving")
    if not serving:
        return row
    return {**row, "spec": {**row["spec"], "serving": serving_replicas.start(serving)}}


#: "until stopped", as a row's end time
SERVING_RUNS_FOR = timedelta(days=3650)

w_never = datetime.min.replace(tzinfo=UTC)


def log_lines(w: SimulatedWorkload, now: datetime) -> list[str]:
    """What the workload has printed by `now`: a header, a step a second, how it ended."""
    if now < w.starts_at:
        return []
    rng = random.Random(f"{w.namespace}/{w.name}")
    env = w.spec.get("env", {})
    lines = [
        f"[qm] {w.name} on {w.node}, devices {w.spec.get('devices', [])}",
        f"[qm] image {w.spec.get('image', '')}",
        f"[qm] command {' '.join(w.spec.get('command', [])) or '(image default)'}",
    ]
    serving = w.spec.get("serving")
    if serving:
        # A model server prints its start, not training steps.
        return (
            lines
            + [
                f"[qm] serving {serving.get('model')} revision {serving.get('revision')} "
                f"with {serving.get('runtime')} on port {serving.get('port')}",
                "loading weights; the readiness probe answers once the model is warmed up",
            ]
            + (["received SIGTERM: draining and exiting"] if w.stopped_at else [])
        )
    if "WORLD_SIZE" in env:
        lines.append(
            f"rank {env.get('RANK')} of {env['WORLD_SIZE']}, master {env.get('MASTER_ADDR')}"
        )
    if env.get("QM_RESUME") == "1":
        lines.append(f"resuming from the last checkpoint in {env.get('QM_CHECKPOINT_DIR')}")
    until = min(now, w.ends_at, w.stopped_at or w.ends_at)
    steps = min(MAX_LOG_STEPS, int((until - w.starts_at).total_seconds()))
    loss = 2.5 + rng.random()
    for step in range(1, steps + 1):
        loss *= 0.97 + rng.random() * 0.02
        lines.append(
            f"epoch {1 + (step - 1) // 100} step {step} loss {loss:.4f} "
            f"lr 3.0e-04 {900 + rng.randint(0, 200)} samples/s"
        )
    if w.stopped_at is not None and w.stopped_at <= now and w.stopped_at < w.ends_at:
        lines.append("received SIGTERM: saving state and exiting")
    elif now >= w.ends_at:
        if w.exit_code == 0:
            lines.append(f"training finished after {steps} steps, final loss {loss:.4f}")
        elif w.exit_code == 137:
            lines.append("Killed")
        else:
            lines += [
                "Traceback (most recent call last):",
                '  File "/app/train.py", line 212, in <module>',
                "    loss.backward()",
                "RuntimeError: CUDA error: an illegal memory access was encountered",
                f"exited with code {w.exit_code}",
            ]
    return lines


def _workload_events(w: SimulatedWorkload, now: datetime) -> list[WorkloadEvent]:
    """The events a Job's pod would get, from the row's times."""
    obj = f"Pod/{w.name}"
    out = [WorkloadEvent(w.created_at, "Normal", "Scheduled", f"assigned to {w.node}", obj)]
    if now >= w.starts_at:
        out += [
            WorkloadEvent(w.starts_at, "Normal", "Pulled", f"image {w.spec.get('image', '')}", obj),
            WorkloadEvent(w.starts_at, "Normal", "Started", "started container main", obj),
        ]
    if w.stopped_at is not None and w.stopped_at <= now:
        out.append(WorkloadEvent(w.stopped_at, "Normal", "Killing", "stopped by the portal", obj))
    elif now >= w.ends_at:
        if w.exit_code == 0:
            out.append(WorkloadEvent(w.ends_at, "Normal", "Completed", "Job completed", obj))
        else:
            out.append(
                WorkloadEvent(
                    w.ends_at,
                    "Warning",
                    "BackoffLimitExceeded",
                    f"container main exited with code {w.exit_code}",
                    obj,
                )
            )
    return out


def operators_act(labels: dict[str, str | None]) -> dict[str, str]:
    """What the GPU Operator, mig-manager and GFD would do with the labels a rollout wrote:
    the driver upgrade completes to the requested version, a MIG config applies."""
    out = {k: v for k, v in labels.items() if v is not None}
    if out.get("nvidia.com/gpu-driver-upgrade-state") == "upgrade-required":
        target = out.get("quartermaster.io/rollout-target", "")
        if target:
            out["nvidia.com/cuda.driver-version.full"] = target
            for part, value in zip(("major", "minor", "revision"), target.split("."), strict=False):
                out[f"nvidia.com/cuda.driver-version.{part}"] = value
        out["nvidia.com/gpu-driver-upgrade-state"] = "upgrade-done"
    if "nvidia.com/mig.config" in out:
        out["nvidia.com/mig.config.state"] = "success"
    return out


#: simulated burn-in figures per interconnect: NCCL all-reduce bus bandwidth, GB/s
SIMULATED_BUSBW = {"nvswitch": 235.0, "nvlink": 180.0, "pcie": 140.0}


def simulated_results(path: str | Path, spec: ValidationSpec) -> dict[str, object]:
    """A node's burn-in results; the cluster file's `validation_failures` (node -> check:
    visibility, nccl, dcgm or warmup) say which nodes fail, and how."""
    data = load_cluster(path)
    for pool in data["pools"]:
        fails = pool["nodes"].get("validation_failures", {})
        prefix = pool["nodes"].get("prefix", pool["name"])
        if not spec.node.startswith(f"{prefix}-"):
            continue
        devices = spec.devices or int(pool["nodes"].get("gpus", 8))
        failing = fails.get(spec.node, "")
        return {
            "devices_visible": devices - (1 if failing == "visibility" else 0),
            "nccl_busbw_gbps": 38.5
            if failing == "nccl"
            else SIMULATED_BUSBW.get(pool.get("interconnect", "pcie"), 140.0),
            "dcgm_diag": "fail: PCIe replay counter rising" if failing == "dcgm" else "pass",
            "warmup_s": 410.0 if failing == "warmup" else 42.0,
        }
    return {"devices_visible": 0, "nccl_busbw_gbps": 0.0, "dcgm_diag": "node not found"}


def _relaid(devices: tuple[InventoryDevice, ...], config: str) -> tuple[InventoryDevice, ...]:
    """mig-manager applying a layout Quartermaster proposed (`qm-<profiles>`) to MIG devices."""
    if not config.startswith("qm-"):
        return devices
    profiles = [p.replace("_me", "+me") for p in config[3:].split("-") if p]
    out = []
    for d in devices:
        if d.partitioning != "mig":
            out.append(d)
            continue
        try:
            out.append(replace(d, mig_instances=mig_instances(profiles, d.model, d.memory_mib)))
        except ClusterFileError:
            out.append(replace(d, healthy=False))
    return tuple(out)
