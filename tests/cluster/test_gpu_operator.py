"""Driver rollouts through the GPU Operator's own API, and the burn-in gate for nodes joining
a pool, against the real control plane (docs/lifecycle.md).

The GPU Operator's CRDs are the vendored ones (tests/fixtures/nvidia.com_*.yaml), applied for
this module only. The Operator itself is not run: the test plays its upgrade controller by
patching `nvidia.com/gpu-driver-upgrade-state` (and GFD's driver version) on the nodes the
NVIDIADriver of the current wave selects, and the burn-in pods by reporting their figures.

Nodes of their own (`go-*`, pools `go` and `go-canary`), removed at the end.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.contrib.auth import get_user_model
from kubernetes import client
from kubernetes.client.exceptions import ApiException

import portal.backends
from portal.backends.kubernetes import KubernetesBackend
from portal.k8s import gpu_operator
from portal.lib import lifecycle
from portal.models import Attempt, Decision, Node, Pool, Quota, Rollout, RolloutNode, ValidationRun
from portal.services.nodes import inventory_sync
from portal.services.requests import gpu_request_submit
from portal.services.rollouts import rollout_start, rollouts_advance
from portal.services.validations import validation_report
from portal.tick.reconcile import reconcile
from portal.tick.run import run_tick
from tests.cluster.conftest import JOB_OPTIONS
from tests.cluster.kube import Cluster, apply_one, merge_patch_node, node_settled, wait_for
from tests.cluster.nodes import POOL, a100
from tests.cluster.world import training_world

pytestmark = pytest.mark.django_db(transaction=True)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CRDS = {
    "nvidiadrivers.nvidia.com": FIXTURES / "nvidia.com_nvidiadrivers.yaml",
    "clusterpolicies.nvidia.com": FIXTURES / "nvidia.com_clusterpolicies.yaml",
}
NODES = {"go-0": "go", "go-1": "go", "go-canary-0": "go-canary"}
VALIDATION_NS = "qm-validation-test"
TARGET = "570.124.06"
GOOD = {"devices_visible": 8, "nccl_busbw_gbps": 231.5, "dcgm_diag": "pass"}
BAD = {**GOOD, "dcgm_diag": "fail: Memory test failed on GPU 3"}


@pytest.fixture(scope="module")
def operator_crds(cluster: Cluster, chart: list[dict[str, Any]]) -> Iterator[None]:
    dyn = cluster.dynamic()
    ext = client.ApiextensionsV1Api(cluster.api())
    for path in CRDS.values():
        apply_one(dyn, yaml.safe_load(path.read_text()))
    for name in CRDS:
        wait_for(
            f"CRD {name} established",
            lambda n=name: any(
                c.type == "Established" and c.status == "True"
                for c in ext.read_custom_resource_definition(n).status.conditions or ()
            ),
            30,
        )
    yield
    for name in CRDS:
        ext.delete_custom_resource_definition(name)


@pytest.fixture
def go(
    cluster: Cluster,
    operator_crds: None,
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[KubernetesBackend]:
    core = cluster.core()
    for name, pool in NODES.items():
        core.create_node(a100(name, pool=pool))
    for name in NODES:
        wait_for(f"node {name} Ready", lambda n=name: node_settled(core.read_node(n)), 60)
    try:
        core.create_namespace({"metadata": {"name": VALIDATION_NS}})
    except ApiException:  # made by an earlier test of the session
        pass
    backend = KubernetesBackend(
        core=core,
        batch=cluster.batch(),
        custom=client.CustomObjectsApi(cluster.api()),
        job_options=JOB_OPTIONS,
        pool_selectors={"go": {POOL: "go"}, "go-canary": {POOL: "go-canary"}},
        image_pull_timeout_s=5,
        validation_image="qm.test/sleep",
    )
    monkeypatch.setattr(portal.backends, "_backend", lambda name: backend)
    settings.VALIDATION_NAMESPACE = VALIDATION_NS
    try:
        yield backend
    finally:
        # Cluster-scoped, and named after rollout ids that the next test's database reuses.
        custom = client.CustomObjectsApi(cluster.api())
        for name in _drivers(cluster):
            custom.delete_cluster_custom_object(
                gpu_operator.GROUP, gpu_operator.DRIVER_VERSION, gpu_operator.DRIVER_PLURAL, name
            )
        batch = cluster.batch()
        for ns in ("team-a", VALIDATION_NS):
            for job in batch.list_namespaced_job(ns).items:
                if job.metadata.name.startswith(("qm-validate-", "qm-")):
                    batch.delete_namespaced_job(
                        job.metadata.name, ns, propagation_policy="Background"
                    )
            for pod in core.list_namespaced_pod(ns).items:
                if pod.spec.node_name in NODES:
                    core.delete_namespaced_pod(pod.metadata.name, ns, grace_period_seconds=0)
        for name in list(NODES) + ["go-new"]:
            try:
                core.delete_node(name)
            except ApiException:
                pass


def _admin() -> Any:
    return get_user_model().objects.create_user("dave", password="pw-dave-123", is_staff=True)


def _step(until: Any, what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        rollouts_advance()
        reconcile()
        if until():
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def _drivers(cluster: Cluster) -> dict[str, dict[str, Any]]:
    found = client.CustomObjectsApi(cluster.api()).list_cluster_custom_object(
        gpu_operator.GROUP, gpu_operator.DRIVER_VERSION, gpu_operator.DRIVER_PLURAL
    )
    return {d["metadata"]["name"]: d for d in found["items"]}


class Operator:
    """The GPU Operator's upgrade controller, as far as the portal sees it: the state label
    of each node an NVIDIADriver selects, step by step, then GFD's new driver version."""

    STEPS = ("upgrade-required", "cordon-required", "drain-required", "validation-required")

    def __init__(self, cluster: Cluster, fail: set[str], policy: bool = False) -> None:
        self.cluster, self.fail, self.policy = cluster, fail, policy
        self.progress: dict[str, int] = {}
        #: node -> the NVIDIADriver that selected it, as written
        self.seen: dict[str, dict[str, Any]] = {}

    def _selected(self) -> list[dict[str, Any]]:
        if not self.policy:
            return list(_drivers(self.cluster).values())
        # One ClusterPolicy version for all: its upgradePolicy paces the nodes; here, the
        # nodes the portal has handed over (their wave drained) move.
        version = _policy(self.cluster)["spec"]["driver"].get("version")
        return [
            {
                "metadata": {"name": POLICY},
                "spec": {"version": version, "nodeSelector": {lifecycle.ROLLOUT_TARGET: version}},
            }
        ]

    def play(self) -> None:
        core = self.cluster.core()
        for nd in self._selected():
            selector = ",".join(f"{k}={v}" for k, v in nd["spec"]["nodeSelector"].items())
            for node in core.list_node(label_selector=selector).items:
                n = node.metadata.name
                self.seen.setdefault(n, nd)
                i = self.progress.get(n, 0)
                self.progress[n] = i + 1
                if i < len(self.STEPS):
                    labels = {lifecycle.DRIVER_UPGRADE_STATE: self.STEPS[i]}
                elif n in self.fail:
                    labels = {lifecycle.DRIVER_UPGRADE_STATE: lifecycle.UPGRADE_FAILED}
                else:
                    labels = {
                        lifecycle.DRIVER_UPGRADE_STATE: lifecycle.UPGRADE_DONE,
                        lifecycle.DRIVER_FULL: nd["spec"]["version"],
                    }
                merge_patch_node(core, n, {"metadata": {"labels": labels}})


def test_a_driver_rollout_writes_an_nvidiadriver_per_wave_and_halts_on_a_failed_burn_in(
    go: KubernetesBackend, cluster: Cluster
) -> None:
    training_world("go", {POOL: "go"})
    canary = Pool.objects.create(
        name="go-canary",
        gpu_model="NVIDIA-A100-SXM4-80GB",
        gpu_memory_mib=81920,
        node_selector={POOL: "go-canary"},
        lifecycle=Pool.Lifecycle.CANARY,
    )
    inventory_sync()
    assert canary.nodes.count() == 1
    # A pool's first nodes are adopted as they are: no burn-in gate for them.
    assert not Node.objects.filter(cordoned=True).exists()

    pool = Pool.objects.get(name="go")
    rollout = rollout_start(
        actor=_admin(), pool=pool, kind="driver", target=TARGET, canary_nodes=1, wave_percent=50
    )
    # The canary pool is wave 0 of every rollout; then the pool's own canary node.
    assert rollout.waves == [["go-canary-0"], ["go-0"], ["go-1"]]
    assert rollout.impact["driver_api"] == "nvidiadriver"
    operator = Operator(cluster, fail=set())
    reported: set[int] = set()

    def play() -> bool:
        operator.play()
        for m in RolloutNode.objects.filter(rollout=rollout, step="validating").select_related(
            "node", "validation"
        ):
            run = m.validation
            if run and run.pk not in reported:
                validation_report(run=run, results=BAD if m.node.name == "go-0" else GOOD)
                reported.add(run.pk)
        rollout.refresh_from_db()
        return rollout.state != Rollout.State.RUNNING

    _step(play, "the rollout to stop", timeout_s=90)
    assert rollout.state == Rollout.State.HALTED, rollout.halt_reason
    assert "halted after wave 1" in rollout.halt_reason
    steps = {m.node.name: m.step for m in rollout.members.select_related("node")}
    assert steps == {"go-canary-0": "returned", "go-0": "failed", "go-1": "waiting"}
    assert "DCGM diagnostics level 1" in RolloutNode.objects.get(node__name="go-0").reason

    # One NVIDIADriver per wave that ran, at the target, selecting only that wave's nodes.
    drivers = _drivers(cluster)
    waves = {lifecycle.driver_wave_name(rollout.pk, w): w for w in (0, 1)}
    assert set(drivers) == set(waves)
    for name, nd in drivers.items():
        assert nd["spec"]["version"] == TARGET
        assert nd["spec"]["driverType"] == "gpu" and nd["spec"]["default"] is False
        assert nd["spec"]["nodeSelector"] == {lifecycle.DRIVER_WAVE: name}
    assert operator.seen["go-canary-0"]["metadata"]["name"] == lifecycle.driver_wave_name(
        rollout.pk, 0
    )
    assert operator.seen["go-0"]["metadata"]["name"] == lifecycle.driver_wave_name(rollout.pk, 1)
    assert "go-1" not in operator.seen

    core = cluster.core()
    seen = {n: core.read_node(n) for n in NODES}
    assert not seen["go-canary-0"].spec.unschedulable
    assert seen["go-0"].spec.unschedulable is True
    assert not seen["go-1"].spec.unschedulable
    assert lifecycle.DRIVER_WAVE not in (seen["go-1"].metadata.labels or {})

    # The portal followed each step the Operator reported, in the audit log.
    from portal.models import AuditEvent

    states = list(
        AuditEvent.objects.filter(action="rollout.upgrade_state", after__node="go-0").values_list(
            "after__state", flat=True
        )
    )
    assert "drain-required" in states
    # The portal's own cordon and drain of each node it handed over, in the decision log.
    codes = set(Decision.objects.filter(node="go-0").values_list("code", flat=True))
    assert {"rollout-cordon", "rollout-drained"} <= codes
    assert not Decision.objects.filter(node="go-1").exists()


POLICY = "cluster-policy"


def _policy(cluster: Cluster) -> dict[str, Any]:
    return client.CustomObjectsApi(cluster.api()).get_cluster_custom_object(
        gpu_operator.GROUP, gpu_operator.POLICY_VERSION, gpu_operator.POLICY_PLURAL, POLICY
    )


def test_a_driver_rollout_through_the_cluster_policy_halts_on_upgrade_failed(
    go: KubernetesBackend, cluster: Cluster
) -> None:
    custom = _policy_create(cluster)
    go.driver_api = "clusterpolicy"
    try:
        training_world("go-canary", {POOL: "go-canary"})
        pool = Pool.objects.get(name="go-canary")
        rollout = rollout_start(actor=_admin(), pool=pool, kind="driver", target=TARGET)
        assert rollout.waves == [["go-canary-0"]]
        assert rollout.impact["driver_api"] == "clusterpolicy"
        operator = Operator(cluster, fail={"go-canary-0"}, policy=True)
        _halted_on_upgrade_failed(cluster, rollout, operator)
        assert _policy(cluster)["spec"]["driver"]["version"] == TARGET
        assert not _drivers(cluster), "no NVIDIADriver where the site runs the ClusterPolicy"
    finally:
        custom.delete_cluster_custom_object(
            gpu_operator.GROUP, gpu_operator.POLICY_VERSION, gpu_operator.POLICY_PLURAL, POLICY
        )


def _policy_create(cluster: Cluster) -> Any:
    custom = client.CustomObjectsApi(cluster.api())
    required = ("daemonsets", "dcgm", "dcgmExporter", "devicePlugin", "gfd")
    spec: dict[str, Any] = {k: {} for k in required}
    spec.update(nodeStatusExporter={}, operator={}, toolkit={}, driver={"version": "550.107.02"})
    spec["devicePlugin"] = {"version": PLUGIN_BEFORE}
    custom.create_cluster_custom_object(
        gpu_operator.GROUP,
        gpu_operator.POLICY_VERSION,
        gpu_operator.POLICY_PLURAL,
        {
            "apiVersion": "nvidia.com/v1",
            "kind": "ClusterPolicy",
            "metadata": {"name": POLICY},
            "spec": spec,
        },
    )
    return custom


PLUGIN_BEFORE, PLUGIN_TARGET = "v0.16.2", "v0.17.1"


OPERATOR_NS = "gpu-operator"


def _plugin_pod(node: str, version: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"nvidia-device-plugin-daemonset-{node}-{version.replace('.', '-')}",
            "labels": {"app": gpu_operator.PLUGIN_APP},
        },
        "spec": {
            "nodeName": node,
            "tolerations": [{"operator": "Exists"}],
            "containers": [
                {"name": "nvidia-device-plugin", "image": f"{gpu_operator.PLUGIN_IMAGE}:{version}"}
            ],
        },
    }


def test_a_device_plugin_rollout_sets_the_cluster_policy_and_follows_the_plugin_pods(
    go: KubernetesBackend, cluster: Cluster
) -> None:
    custom = _policy_create(cluster)
    go.driver_api = "nvidiadriver"
    core = cluster.core()
    try:
        core.create_namespace({"metadata": {"name": OPERATOR_NS}})
    except ApiException:  # made by an earlier run of the session
        pass
    # The Operator's device-plugin DaemonSet, as the portal sees it: a pod per node.
    core.create_namespaced_pod(OPERATOR_NS, _plugin_pod("go-canary-0", PLUGIN_BEFORE))
    try:
        training_world("go-canary", {POOL: "go-canary"})
        pool = Pool.objects.get(name="go-canary")
        rollout = rollout_start(
            actor=_admin(), pool=pool, kind="device-plugin", target=PLUGIN_TARGET
        )
        assert rollout.impact["driver_api"] == "nvidiadriver"
        reported: set[int] = set()
        replaced: list[str] = []

        def play() -> bool:
            # Once the ClusterPolicy names the new version the DaemonSet replaces the pod.
            version = _policy(cluster)["spec"]["devicePlugin"].get("version")
            if version == PLUGIN_TARGET and not replaced:
                old = _plugin_pod("go-canary-0", PLUGIN_BEFORE)["metadata"]["name"]
                core.delete_namespaced_pod(old, OPERATOR_NS, grace_period_seconds=0)
                core.create_namespaced_pod(OPERATOR_NS, _plugin_pod("go-canary-0", version))
                replaced.append(version)
            for m in RolloutNode.objects.filter(rollout=rollout, step="validating"):
                run = m.validation
                if run and run.pk not in reported:
                    validation_report(run=run, results=GOOD)
                    reported.add(run.pk)
            rollout.refresh_from_db()
            return rollout.state != Rollout.State.RUNNING

        _step(play, "the rollout to end", timeout_s=20)
        assert rollout.state == Rollout.State.SUCCEEDED, rollout.halt_reason
        policy = _policy(cluster)["spec"]
        # The plugin's version lives on the ClusterPolicy only; the driver's is left alone.
        assert policy["devicePlugin"]["version"] == PLUGIN_TARGET
        assert policy["driver"]["version"] == "550.107.02"
        assert not _drivers(cluster)
        node = core.read_node("go-canary-0")
        assert not node.spec.unschedulable
        assert node.metadata.labels[lifecycle.ROLLOUT_TARGET] == PLUGIN_TARGET
        # Not the labels-only way: no device-plugin config label written, none read.
        assert lifecycle.DEVICE_PLUGIN_CONFIG not in node.metadata.labels
        assert lifecycle.DEVICE_PLUGIN_VERSION not in node.metadata.labels
        m = RolloutNode.objects.get(rollout=rollout)
        assert m.step == "returned" and m.validation is not None
    finally:
        custom.delete_cluster_custom_object(
            gpu_operator.GROUP, gpu_operator.POLICY_VERSION, gpu_operator.POLICY_PLURAL, POLICY
        )
        for pod in core.list_namespaced_pod(OPERATOR_NS).items:
            core.delete_namespaced_pod(pod.metadata.name, OPERATOR_NS, grace_period_seconds=0)


def _halted_on_upgrade_failed(cluster: Cluster, rollout: Rollout, operator: Operator) -> None:
    def play() -> bool:
        operator.play()
        rollout.refresh_from_db()
        return rollout.state != Rollout.State.RUNNING

    _step(play, "the rollout to stop")
    assert operator.progress["go-canary-0"] > len(Operator.STEPS)
    assert rollout.state == Rollout.State.HALTED
    m = RolloutNode.objects.get(rollout=rollout)
    assert m.step == "failed" and "upgrade-failed" in m.reason
    # No burn-in for a node whose upgrade failed; it stays cordoned with the reason.
    assert not ValidationRun.objects.filter(node=m.node).exists()
    assert cluster.core().read_node("go-canary-0").spec.unschedulable is True


def test_a_new_node_serves_only_after_its_burn_in_passes(
    go: KubernetesBackend, cluster: Cluster
) -> None:
    w = training_world("go", {POOL: "go"})
    # Room in the quota for a third 8-GPU request: only the gate can keep it off go-new.
    Quota.objects.filter(team=w["team"]).update(nominal_milli=24000)
    core = cluster.core()

    def submit() -> Any:
        return gpu_request_submit(
            user=w["user"],
            team=w["team"],
            workload_class=w["cls"],
            pool=w["pool"],
            image="qm.test/sleep",
            command=["python", "train.py"],
            count=8,
            cpu_milli=4000,
            estimated_runtime_s=3600,
        )

    first, second = submit(), submit()
    run_tick()
    assert Attempt.objects.filter(request__in=[first, second]).count() == 2

    core.create_node(a100("go-new", pool="go"))
    wait_for("node go-new Ready", lambda: node_settled(core.read_node("go-new")), 60)
    inventory_sync()
    node = Node.objects.get(name="go-new")
    assert node.cordoned and node.maintenance_reason.startswith("burn-in before serving")
    rollouts_advance()  # the beat starts its burn-in: a Job pinned to the node
    [run] = ValidationRun.objects.filter(node=node)
    job = cluster.batch().read_namespaced_job(run.name, VALIDATION_NS)
    assert job.spec.template.spec.node_selector == {"kubernetes.io/hostname": "go-new"}
    wait_for("go-new cordoned", lambda: core.read_node("go-new").spec.unschedulable, 15)
    third = submit()
    run_tick()
    assert not Attempt.objects.filter(request=third).exists(), "placed before its burn-in"

    validation_report(run=run, results=GOOD)
    rollouts_advance()
    run.refresh_from_db()
    assert run.state == "passed"
    wait_for("go-new uncordoned", lambda: not core.read_node("go-new").spec.unschedulable, 15)
    inventory_sync()
    run_tick()
    [attempt] = Attempt.objects.filter(request=third)
    assert {a.device.node.name for a in attempt.allocations.select_related("device__node")} == {
        "go-new"
    }
