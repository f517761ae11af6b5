"""The generated Job: allowlisted, restricted, pinned to its node, valid against the schema.

Real-cluster twins: tests/cluster/test_chart.py (admitted by Pod Security, quota and the
admission policy) and tests/cluster/test_workloads.py (bound by kube-scheduler)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import kubernetes_validate
import pytest

from portal.backends.base import GrantSpec
from portal.k8s.jobs import READY_SCRIPT, job_build, job_to_dict
from portal.k8s.names import READY_CONTAINER, READY_EXIT_BUSY, READY_EXIT_REFUSED, LaunchRefused
from portal.lib.readiness import attempt_token
from tests.k8s.builders import OPTIONS, mig_spec, shared_spec, spec
from tests.k8s.pss import restricted_violations

#: the Kubernetes version the generated Jobs are validated against (kubernetes-validate ships 1.25-1.37;
#: podFailurePolicy is GA since 1.31)
KUBE_VERSION = "1.32.0"


def job(s=None, facts=None, options=OPTIONS) -> dict[str, Any]:  # noqa: ANN001
    return job_to_dict(job_build(s or spec(), options, facts))


def pod(j: dict[str, Any]) -> dict[str, Any]:
    return j["spec"]["template"]["spec"]


def container(j: dict[str, Any], name: str = "main") -> dict[str, Any]:
    cs = (pod(j).get("initContainers") or []) + pod(j)["containers"]
    return next(c for c in cs if c["name"] == name)


def env(c: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in c.get("env") or ()}


ALL_SPECS = {
    "whole": (spec(), None),
    "mig": (
        mig_spec(),
        {"hostname": "gpu-mig", "resources": ["nvidia.com/mig-3g.40gb"], "mig_strategy": "mixed"},
    ),
    "shared": (shared_spec(), {"hostname": "gpu-ts", "resources": ["nvidia.com/gpu.shared"]}),
    "shared-mps": (
        replace(shared_spec(), sharing_engine="mps"),
        {"hostname": "gpu-ts", "resources": ["nvidia.com/gpu"]},
    ),
    "shared-hami": (
        replace(shared_spec(), sharing_engine="hami"),
        {"hostname": "gpu-ts", "resources": ["nvidia.com/gpu", "nvidia.com/gpumem"]},
    ),
    "cpu-only": (spec(name="qm-45-1", grants=(), profile_kind="whole"), None),
    "no-ready-check": (spec(), None),
}


@pytest.mark.parametrize("case", sorted(ALL_SPECS))
def test_it_validates_strictly_against_the_kubernetes_schema(case: str) -> None:
    s, facts = ALL_SPECS[case]
    options = replace(OPTIONS, portal_url="") if case == "no-ready-check" else OPTIONS
    kubernetes_validate.validate(job(s, facts, options), KUBE_VERSION, strict=True)


def test_strict_validation_catches_a_misspelt_field() -> None:
    bad = job()
    pod(bad)["nodeNmae"] = "gpu-a"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, KUBE_VERSION, strict=True)


@pytest.mark.parametrize("case", sorted(ALL_SPECS))
def test_it_passes_pod_security_restricted(case: str) -> None:
    s, facts = ALL_SPECS[case]
    j = job(s, facts)
    assert restricted_violations(pod(j)) == []
    assert pod(j)["automountServiceAccountToken"] is False
    assert "nodeName" not in pod(j)


def test_it_pins_the_node_by_required_affinity_never_node_name() -> None:
    j = job(spec(), {"hostname": "ip-10-0-0-1.ec2.internal", "resources": ["nvidia.com/gpu"]})
    terms = pod(j)["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"] == [
        {
            "matchExpressions": [
                {
                    "key": "kubernetes.io/hostname",
                    "operator": "In",
                    "values": ["ip-10-0-0-1.ec2.internal"],
                }
            ]
        }
    ]
    assert "nodeName" not in pod(j)


def test_it_carries_the_server_side_settings() -> None:
    j = job()
    assert j["metadata"]["name"] == "qm-42-1" and j["metadata"]["namespace"] == "team-a"
    assert "generateName" not in j["metadata"]
    labels = j["metadata"]["labels"]
    assert labels["app.kubernetes.io/managed-by"] == "quartermaster"
    assert (
        labels["quartermaster.io/request-id"] == "42"
        and labels["quartermaster.io/attempt-id"] == "7"
    )
    assert j["spec"]["template"]["metadata"]["labels"] == labels
    assert pod(j)["priorityClassName"] == "quartermaster-training"
    assert pod(j)["restartPolicy"] == "Never"
    assert j["spec"]["backoffLimit"] == 2
    assert j["spec"]["ttlSecondsAfterFinished"] == 86400
    assert j["spec"]["activeDeadlineSeconds"] == 86400
    assert j["spec"]["podReplacementPolicy"] == "Failed"
    assert pod(j)["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "pool", "operator": "Equal", "value": "a100", "effect": "NoSchedule"},
    ]
    assert pod(j)["terminationGracePeriodSeconds"] == 30
    assert env(container(j))["QUARTERMASTER_ATTEMPT"] == "1"


def test_it_has_the_pod_failure_policy() -> None:
    """FI-13: the rendered Job ignores disruptions (DisruptionTarget) and fails on listed exit codes."""
    rules = job()["spec"]["podFailurePolicy"]["rules"]
    assert rules[0] == {
        "action": "Ignore",
        "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
    }
    assert {
        "action": "FailJob",
        "onExitCodes": {"containerName": "main", "operator": "In", "values": [137]},
    } in rules
    assert {
        "action": "FailJob",
        "onExitCodes": {"containerName": "wait-for-device", "operator": "In", "values": [75, 76]},
    } in rules


@pytest.mark.parametrize(
    ("case", "resource", "count"),
    [
        ("whole", "nvidia.com/gpu", "2"),
        ("mig", "nvidia.com/mig-3g.40gb", "1"),
        ("shared", "nvidia.com/gpu.shared", "1"),
    ],
)
def test_it_requests_the_exact_extended_resource(case: str, resource: str, count: str) -> None:
    s, facts = ALL_SPECS[case]
    res = container(job(s, facts))["resources"]
    assert res["limits"][resource] == count and res["requests"][resource] == count
    assert [k for k in res["limits"] if k.startswith("nvidia.com/")] == [resource]


def test_it_uses_the_plain_resource_where_the_node_does_not_rename_shares_or_mig_is_single() -> (
    None
):
    shared = job(shared_spec(), {"resources": ["nvidia.com/gpu"]})
    assert "nvidia.com/gpu" in container(shared)["resources"]["limits"]
    single = job(mig_spec(), {"resources": ["nvidia.com/gpu"], "mig_strategy": "single"})
    assert container(single)["resources"]["limits"]["nvidia.com/gpu"] == "1"


def test_it_caps_shared_units_at_one_per_container() -> None:
    two = replace(shared_spec(), grants=(GrantSpec(0, 250, 1024), GrantSpec(1, 250, 1024)))
    with pytest.raises(LaunchRefused):
        job_build(two, OPTIONS)


@pytest.mark.parametrize(
    "name",
    [
        "NVIDIA_VISIBLE_DEVICES",
        "NVIDIA_DRIVER_CAPABILITIES",
        "CUDA_VISIBLE_DEVICES",
        "QUARTERMASTER_ATTEMPT",
        "bad name",
        "1X",
    ],
)
def test_it_refuses_env_that_could_escape_the_gpu_request(name: str) -> None:
    with pytest.raises(LaunchRefused):
        job_build(spec(env=((name, "all"),)), OPTIONS)


def test_it_hides_gpus_from_containers_without_a_gpu() -> None:
    j = job(spec(name="qm-45-1", grants=()))
    assert env(container(j))["NVIDIA_VISIBLE_DEVICES"] == "void"
    assert not any(k.startswith("nvidia.com/") for k in container(j)["resources"]["limits"])
    assert "initContainers" not in pod(j)
    # A GPU container gets its devices from the device plugin, never from us.
    assert "NVIDIA_VISIBLE_DEVICES" not in env(container(job()))


@pytest.mark.parametrize(
    "field,value",
    [("name", "QM_42"), ("name", "x" * 64), ("namespace", "Team A"), ("image", ""), ("node", "")],
)
def test_it_refuses_bad_identity(field: str, value: str) -> None:
    with pytest.raises(LaunchRefused):
        job_build(replace(spec(), **{field: value}), OPTIONS)


def test_it_enforces_the_image_allowlist() -> None:
    options = replace(OPTIONS, allowed_images=("registry.example.com/",))
    with pytest.raises(LaunchRefused):
        job_build(spec(), options)
    job_build(spec(image="registry.example.com/team-a/train:1"), options)


def test_the_ready_init_container_asks_for_the_same_devices() -> None:
    j = job()
    init = container(j, "wait-for-device")
    assert init["resources"]["limits"]["nvidia.com/gpu"] == "2"
    e = env(init)
    assert e["QM_READY_URL"] == "http://qm-web.quartermaster.svc:8000/api/v1/agent/attempts/7/ready"
    assert e["QM_READY_TOKEN"] == attempt_token("test-key", "team-a", "qm-42-1", 7)
    assert e["QM_READY_TOKEN"] != attempt_token("test-key", "team-a", "qm-42-1", 8)
    assert init["image"] == OPTIONS.ready_image


class _Portal(BaseHTTPRequestHandler):
    answers: list[tuple[int, dict[str, Any]]] = []
    seen: list[tuple[str, str]] = []

    def do_GET(self) -> None:  # noqa: N802
        type(self).seen.append((self.path, self.headers.get("Authorization", "")))
        code, body = (
            type(self).answers.pop(0) if len(type(self).answers) > 1 else type(self).answers[0]
        )
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


def run_ready_script(
    answers: list[tuple[int, dict[str, Any]]], timeout: str = "30"
) -> tuple[int, list]:
    _Portal.answers = list(answers)
    _Portal.seen = []
    server = HTTPServer(("127.0.0.1", 0), _Portal)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        env = {
            "QM_READY_URL": f"http://127.0.0.1:{server.server_port}/api/v1/agent/attempts/7/ready",
            "QM_READY_TOKEN": "tok",
            "QM_READY_TIMEOUT": timeout,
            "QM_READY_INTERVAL": "0.01",
            "NVIDIA_VISIBLE_DEVICES": "GPU-aaa,GPU-bbb",
        }
        rc = subprocess.run(
            [sys.executable, "-c", READY_SCRIPT], env=env, timeout=30, capture_output=True
        ).returncode
    finally:
        server.shutdown()
    return rc, _Portal.seen


def test_the_ready_script_waits_until_the_portal_says_ready() -> None:
    rc, seen = run_ready_script(
        [(200, {"ready": False, "reason": "pid 1 holds memory"}), (503, {}), (200, {"ready": True})]
    )
    assert rc == 0
    assert len(seen) == 3
    assert seen[0] == ("/api/v1/agent/attempts/7/ready?devices=GPU-aaa%2CGPU-bbb", "Bearer tok")


def test_the_ready_script_gives_up_when_refused_or_late() -> None:
    assert run_ready_script([(410, {})])[0] == READY_EXIT_REFUSED
    assert run_ready_script([(200, {"ready": False})], timeout="0")[0] == READY_EXIT_BUSY


def test_a_me_profile_asks_for_the_renamed_resource() -> None:
    """`1g.10gb+me` is `nvidia.com/mig-1g.10gb.me`: a `+` is invalid in a resource name.
    Real-cluster twin: tests/cluster/test_workloads.py (the apiserver rejects the `+`)."""
    facts = {
        "hostname": "gpu-mig",
        "resources": ["nvidia.com/mig-1g.10gb.me"],
        "mig_strategy": "mixed",
    }
    c = container(job(mig_spec(profile="1g.10gb+me", start=6), facts))
    assert c["resources"]["requests"]["nvidia.com/mig-1g.10gb.me"] == "1"
    assert c["resources"]["limits"] == {"memory": "65536Mi", "nvidia.com/mig-1g.10gb.me": "1"}


def test_a_gang_is_one_job_per_pod_each_pinned_to_its_node() -> None:
    """Real-cluster twin: tests/cluster/test_portal_flow.py (one pod on each of the gang's nodes)."""
    from portal.backends.base import PodLaunch
    from portal.k8s.jobs import gang_build

    g0 = (GrantSpec(0, 1000), GrantSpec(1, 1000))
    g1 = (GrantSpec(2, 1000), GrantSpec(3, 1000))
    s = spec(pods=(PodLaunch(0, "gpu-a", g0), PodLaunch(1, "gpu-b", g1)))
    with pytest.raises(LaunchRefused):
        job_build(s, OPTIONS)  # a gang is never one Job
    service, jobs = gang_build(s, OPTIONS)
    assert service.spec.cluster_ip == "None"
    for rank, (node, grants) in enumerate((("gpu-a", g0), ("gpu-b", g1))):
        j = job_to_dict(jobs[rank])
        assert j["metadata"]["name"] == f"{s.name}-{rank}"
        assert (j["spec"]["completions"], j["spec"]["parallelism"]) == (1, 1)
        assert "completionMode" not in j["spec"]
        [term] = pod(j)["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]["nodeSelectorTerms"]
        assert term["matchExpressions"][0]["values"] == [node]
        assert json.loads(j["metadata"]["annotations"]["quartermaster.io/grants"]) == [
            {
                "device": g.device,
                "milli": 1000,
                "gpu_memory_mib": 0,
                "mig_profile": "",
                "mig_start": -1,
            }
            for g in grants
        ]
        assert j["metadata"]["labels"]["quartermaster.io/attempt-id"] == str(s.attempt_id)


def test_every_gang_pod_gets_torchruns_variables_beside_world_size_and_rank() -> None:
    """A bare `torchrun train.py` reads PET_*; scripts written for torch.distributed read the rest."""
    from portal.backends.base import RENDEZVOUS_PORT, PodLaunch
    from portal.k8s.jobs import gang_build

    g0 = (GrantSpec(0, 1000), GrantSpec(1, 1000))
    g1 = (GrantSpec(2, 1000), GrantSpec(3, 1000))
    s = spec(pods=(PodLaunch(0, "gpu-a", g0), PodLaunch(1, "gpu-b", g1)))
    _, jobs = gang_build(s, OPTIONS)
    master = f"{s.name}-0.{s.name}.{s.namespace}.svc"
    for rank, j in enumerate(jobs):
        e = env(container(job_to_dict(j)))
        assert (e["WORLD_SIZE"], e["RANK"], e["MASTER_ADDR"]) == ("2", str(rank), master)
        assert e["PET_NNODES"] == "2"
        assert e["PET_NODE_RANK"] == str(rank)
        assert e["PET_MASTER_ADDR"] == master
        assert e["PET_MASTER_PORT"] == str(RENDEZVOUS_PORT)
        assert e["PET_NPROC_PER_NODE"] == "2"


@pytest.mark.parametrize("name", ["PET_NNODES", "PET_NODE_RANK", "pet_master_addr"])
def test_it_refuses_a_request_env_that_overrides_torchruns_variables(name: str) -> None:
    with pytest.raises(LaunchRefused):
        job_build(spec(env=((name, "9"),)), OPTIONS)


def _shared(engine: str, milli: int = 250, memory_mib: int = 12288):  # noqa: ANN202
    return replace(shared_spec(), sharing_engine=engine, grants=(GrantSpec(0, milli, memory_mib),))


@pytest.mark.parametrize("engine", ["none", "time-slicing"])
def test_a_time_sliced_slice_is_only_told_its_memory_cap(engine: str) -> None:
    j = job(_shared(engine), {"resources": ["nvidia.com/gpu"]})
    main = container(j)
    assert env(main)["QUARTERMASTER_GPU_MEMORY_MIB"] == "12288"
    assert not any(k.startswith("CUDA_MPS_") for k in env(main))
    assert main["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert "nvidia.com/gpumem" not in main["resources"]["limits"]


def test_an_mps_slice_gets_its_memory_limit_and_thread_share() -> None:
    j = job(_shared("mps", milli=250), {"resources": ["nvidia.com/gpu"]})
    main = container(j)
    assert env(main)["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=12288M"
    assert env(main)["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert main["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert "nvidia.com/gpumem" not in main["resources"]["limits"]


def test_a_hami_slice_requests_its_caps_as_hami_resources() -> None:
    # the node advertises the renamed shared resource; HAMi still takes nvidia.com/gpu
    j = job(_shared("hami", milli=300, memory_mib=8192), {"resources": ["nvidia.com/gpu.shared"]})
    for name in ("main", READY_CONTAINER):
        c = container(j, name)
        for side in ("requests", "limits"):
            got = c["resources"][side]
            assert got["nvidia.com/gpu"] == "1", (name, side)
            assert got["nvidia.com/gpumem"] == "8192", (name, side)
            assert got["nvidia.com/gpucores"] == "30", (name, side)
            assert "nvidia.com/gpu.shared" not in got
    assert not any(k.startswith("CUDA_MPS_") for k in env(container(j)))


def test_a_whole_gpu_on_a_hami_pool_asks_for_no_caps() -> None:
    j = job(replace(spec(), sharing_engine="hami"))
    assert "nvidia.com/gpumem" not in container(j)["resources"]["limits"]


@pytest.mark.parametrize(
    ("engine", "name"),
    [("mps", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), ("hami", "CUDA_DEVICE_MEMORY_LIMIT")],
)
def test_a_user_may_not_set_the_engine_caps(engine: str, name: str) -> None:
    s = replace(_shared(engine), env=((name, "100"),))
    with pytest.raises(LaunchRefused, match=name):
        job(s, {"resources": ["nvidia.com/gpu"]})
