"""The control plane rows of `manage.py chaos`: kube-apiserver or etcd restarted while attempts
launch, on a real control plane (scripts/controlplane).

A steady stream of submits, each followed by a tick (which admits and creates the Job) and a
reconcile (which relaunches what was not created and reads the states back), as beat and the
worker would run them. A restart starts a few submits in; the stream goes on through it. Then
ticks go on until every request has launched (its attempt running or done) or `settle_s`
passed. The row counts:

- `jobs`: Jobs of the stream's attempts on the cluster; `double`: attempts with more than one
  Job, or requests with more than one live attempt (a double launch);
- `launched`: requests whose attempt reached running or succeeded; `stuck`: the others;
- `tick_errors`: ticks or reconciles that raised (the cluster away);
- `launched_s`: from the restart's return until every request submitted so far launched.

`tests/cluster/test_chaos_controlplane.py` runs both rows; the command runs them on a control
plane of its own (see `chaos.py`).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from portal.k8s.names import L_ATTEMPT_ID
from portal.models import Attempt, GpuRequest, Pool, Team, WorkloadClass
from portal.services.requests import gpu_request_submit
from portal.tick.reconcile import reconcile
from portal.tick.run import run_tick

LAUNCHED = (GpuRequest.State.RUNNING, GpuRequest.State.SUCCEEDED)
#: an image the simulated kubelet (kwok) runs for 2 s, then ends with exit 0
IMAGE = "qm.test/ok"


@dataclass
class StreamWorld:
    """Who submits the stream, and where: a member of `team` in `workload_class` on `pool`."""

    user: Any
    team: Team
    workload_class: WorkloadClass
    pool: Pool


def restart_under_launches(
    fault: str,
    restart: Callable[[], object],
    world: StreamWorld,
    *,
    batch: Any,
    submits: int = 8,
    interval_s: float = 0.5,
    restart_after: int = 3,
    settle_s: float = 45.0,
) -> dict[str, Any]:
    """One row: `submits` requests, one every `interval_s`, `restart` run in a thread after
    `restart_after` of them; bounded by `settle_s` after the last submit."""
    errors = 0

    def step() -> None:
        nonlocal errors
        for fn in (run_tick, reconcile):
            try:
                fn()
            except Exception:  # noqa: BLE001 - the cluster is away: the next tick tries again
                errors += 1

    ids: list[int] = []
    done = threading.Event()
    window: dict[str, float] = {}

    def restarter() -> None:
        window["down"] = time.monotonic()
        try:
            restart()
        finally:
            window["back"] = time.monotonic()
            done.set()

    thread = threading.Thread(target=restarter, daemon=True)
    for i in range(submits):
        if i == restart_after:
            thread.start()
        started = time.monotonic()
        ids.append(_submit(world, f"chaos-{fault.split()[0].lower()}-{i}"))
        step()
        time.sleep(max(0.0, interval_s - (time.monotonic() - started)))
    if not thread.is_alive() and "down" not in window:
        thread.start()  # fewer submits than restart_after: restart now
    done.wait(timeout=settle_s)
    deadline = time.monotonic() + settle_s
    launched_s: float | None = None
    while True:
        n = GpuRequest.objects.filter(pk__in=ids, state__in=LAUNCHED).count()
        if n == len(ids) and done.is_set():
            launched_s = round(time.monotonic() - window["back"], 1)
            break
        if time.monotonic() > deadline:
            break
        step()
        time.sleep(0.3)
    row = _row(fault, ids, world.team.namespace, batch)
    row.update(
        outage_s=round(window.get("back", 0.0) - window.get("down", 0.0), 1),
        tick_errors=errors,
        launched_s=launched_s,
    )
    row["ok"] = row["double"] == 0 and row["stuck"] == 0 and launched_s is not None
    return row


def _submit(world: StreamWorld, name: str) -> int:
    """One GPU for a short training run: admitted at once while the pool has room."""
    return gpu_request_submit(
        user=world.user,
        team=world.team,
        workload_class=world.workload_class,
        pool=world.pool,
        image=IMAGE,
        command=["python", "train.py"],
        count=1,
        cpu_milli=1000,
        estimated_runtime_s=60,
        name=name,
    ).pk


def _row(fault: str, ids: list[int], namespace: str, batch: Any) -> dict[str, Any]:
    """What the cluster and the database hold of the stream `ids`: attempts, Jobs, double
    launches, launched and stuck requests."""
    attempts = list(Attempt.objects.filter(request_id__in=ids).values_list("pk", flat=True))
    live = Counter(
        Attempt.objects.filter(request_id__in=ids, state__in=Attempt.ACTIVE_STATES).values_list(
            "request_id", flat=True
        )
    )
    jobs = Counter(
        (j.metadata.labels or {}).get(L_ATTEMPT_ID)
        for j in batch.list_namespaced_job(namespace, label_selector=L_ATTEMPT_ID).items
    )
    of_stream = [jobs[str(pk)] for pk in attempts]
    launched = GpuRequest.objects.filter(pk__in=ids, state__in=LAUNCHED).count()
    return {
        "fault": fault,
        "requests": len(ids),
        "attempts": len(attempts),
        "jobs": sum(of_stream),
        "double": sum(n > 1 for n in of_stream) + sum(n > 1 for n in live.values()),
        "launched": launched,
        "stuck": len(ids) - launched,
    }


# --- the command's own world on a control plane of its own -------------------------------

POOL_LABEL = "quartermaster.io/pool"
POOL_NAME = "chaos-a100"
NAMESPACE = "qm-chaos"


def _node(name: str) -> dict[str, Any]:
    """An 8× A100 node as GPU Feature Discovery and the device plugin publish it, run by kwok."""
    capacity = {"cpu": "128", "memory": "1056Gi", "pods": "110", "nvidia.com/gpu": "8"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"kwok.x-k8s.io/node": "fake"},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                POOL_LABEL: POOL_NAME,
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
                "nvidia.com/gpu.memory": "81920",
                "nvidia.com/gpu.count": "8",
                "nvidia.com/gpu.replicas": "1",
                "nvidia.com/gpu.sharing-strategy": "none",
                "nvidia.com/mig.capable": "true",
                "nvidia.com/mig.strategy": "none",
            },
        },
        "status": {"capacity": capacity, "allocatable": capacity},
    }


def cluster_world(core: Any, batch: Any) -> StreamWorld:
    """Two kwok GPU nodes and a namespace on the cluster (made if absent, this run's Jobs
    removed), and the portal's side of them in the (fresh) database: one pool, one class,
    one team with quota and a member."""
    from django.contrib.auth import get_user_model
    from kubernetes.client.exceptions import ApiException

    from portal.models import DeviceProfile, Membership, Quota
    from portal.services.nodes import inventory_sync
    from portal.services.teams import team_create

    def absent_ok(fn: Callable[[], object]) -> None:
        try:
            fn()
        except ApiException as exc:
            if exc.status != 409:
                raise

    for name in (f"{POOL_NAME}-0", f"{POOL_NAME}-1"):
        absent_ok(lambda n=name: core.create_node(_node(n)))  # type: ignore[misc]
    absent_ok(lambda: core.create_namespace({"metadata": {"name": NAMESPACE}}))
    # attempt ids start again with the database: an earlier run's Jobs would conflict
    batch.delete_collection_namespaced_job(
        NAMESPACE, label_selector=L_ATTEMPT_ID, propagation_policy="Background"
    )
    deadline = time.monotonic() + 60
    while batch.list_namespaced_job(NAMESPACE, label_selector=L_ATTEMPT_ID).items:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the Jobs of an earlier run in {NAMESPACE} did not go")
        time.sleep(0.5)
    whole = DeviceProfile.objects.create(name="whole", kind="whole")
    cls = WorkloadClass.objects.create(
        name="training", band=100, preemption="always", default_profile=whole
    )
    pool = Pool.objects.create(
        name=POOL_NAME,
        gpu_model="NVIDIA-A100-SXM4-80GB",
        gpu_memory_mib=81920,
        node_selector={POOL_LABEL: POOL_NAME},
    )
    team = team_create(actor=None, name="chaos", namespace=NAMESPACE)
    Quota.objects.create(team=team, pool=pool, nominal_milli=16000)
    user = get_user_model().objects.create_user("chaos", password=None)
    Membership.objects.create(user=user, team=team, role="member")
    inventory_sync()
    return StreamWorld(user=user, team=team, workload_class=cls, pool=pool)


def run_cluster_faults(
    kubeconfig: str, faults: list[tuple[str, str]], *, submits: int, settle_s: float, err: Any
) -> list[dict[str, Any]]:
    """Each (name, shell command) fault as one row, on the cluster `kubeconfig` names."""
    import shlex
    import subprocess

    from portal import backends
    from portal.backends.kubernetes import KubernetesBackend
    from portal.k8s.jobs import JobOptions

    backend = KubernetesBackend(
        kubeconfig=kubeconfig,
        job_options=JobOptions(
            termination_grace_s=2, ttl_seconds_after_finished=600, backoff_limit=0
        ),
        pool_selectors={POOL_NAME: {POOL_LABEL: POOL_NAME}},
        watch_namespaces=(NAMESPACE,),
        image_pull_timeout_s=5,
    )
    backends.use_backend(backend)
    core, batch = backend.core, backend.batch
    stop = threading.Event()
    try:
        world = cluster_world(core, batch)
        backend.start_watching(stop, resync_s=3600)
        watcher = backend.watcher
        deadline = time.monotonic() + 60
        while watcher is not None and not watcher.synced():
            if time.monotonic() > deadline:
                raise RuntimeError("the watch of the chaos namespace did not sync")
            time.sleep(0.2)
        rows = []
        for name, command in faults:
            err.write(f"chaos: {name} while attempts launch\n")

            def restart(command: str = command) -> None:
                subprocess.run(shlex.split(command), check=True, timeout=300)

            rows.append(
                restart_under_launches(
                    name, restart, world, batch=batch, submits=submits, settle_s=settle_s
                )
            )
            err.write(f"chaos: {rows[-1]}\n")
        return rows
    finally:
        stop.set()
        backends.use_backend(None)
