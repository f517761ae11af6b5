"""The node burn-in Job (portal/k8s/validation.py) and how its end is read; node patches."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from kubernetes import client

from portal.backends.base import ValidationSpec
from portal.backends.kubernetes import KubernetesBackend
from portal.k8s.jobs import job_to_dict
from portal.k8s.validation import results_from_log, validation_job_build, validation_status_from_job

SPEC = ValidationSpec(
    name="qm-validate-7",
    namespace="quartermaster-validation",
    node="a100-03",
    resources=(("nvidia.com/gpu", 8),),
    devices=8,
    report_url="https://qm.example.com/api/v1/validations/7/result",
    token="t0k",
)


def test_the_job_takes_every_gpu_of_its_node_and_tolerates_its_cordon() -> None:
    job = job_to_dict(validation_job_build(SPEC, "registry.example.com/burn-in:1"))
    pod = job["spec"]["template"]["spec"]
    assert job["metadata"]["namespace"] == "quartermaster-validation"
    assert job["spec"]["backoffLimit"] == 0
    assert pod["nodeSelector"] == {"kubernetes.io/hostname": "a100-03"}
    assert pod["tolerations"] == [{"operator": "Exists"}]
    assert pod["automountServiceAccountToken"] is False
    [c] = pod["containers"]
    assert c["resources"] == {
        "limits": {"nvidia.com/gpu": "8"},
        "requests": {"nvidia.com/gpu": "8"},
    }
    script = c["command"][-1]
    for step in (
        "nvidia-smi -L",
        "all_reduce_perf",
        'dcgmi diag -r "${QM_DCGM_LEVEL',
        "QM_VALIDATION",
    ):
        assert step in script
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env == {"QM_REPORT_URL": SPEC.report_url, "QM_REPORT_TOKEN": "t0k", "QM_DCGM_LEVEL": "1"}
    # One image carrying both: no init container.
    assert not pod.get("initContainers")


def test_dcgm_diag_runs_first_from_the_dcgm_image_at_the_asked_level() -> None:
    from dataclasses import replace

    dcgm = "nvcr.io/nvidia/cloud-native/dcgm:4.2.3-1-ubuntu22.04"
    job = job_to_dict(validation_job_build(replace(SPEC, dcgm_level=3), "nccl-tests:1", dcgm))
    pod = job["spec"]["template"]["spec"]
    [init] = pod["initContainers"]
    [main] = pod["containers"]
    assert init["image"] == dcgm and main["image"] == "nccl-tests:1"
    assert "dcgmi diag" in init["command"][-1] and "nv-hostengine" in init["command"][-1]
    assert {e["name"]: e["value"] for e in init["env"]} == {"QM_DCGM_LEVEL": "3"}
    # The GPUs are the node's for both; the verdict passes through the shared volume.
    assert init["resources"] == main["resources"]
    mounts = {m["mountPath"] for c in (init, main) for m in c["volumeMounts"]}
    assert mounts == {"/results"}
    assert pod["volumes"] == [{"name": "results", "emptyDir": {}}]


def _job(*conditions: tuple[str, str]) -> Any:
    return SimpleNamespace(
        status=SimpleNamespace(
            conditions=[
                client.V1JobCondition(type=t, status="True", message=m) for t, m in conditions
            ]
        )
    )


LOG = 'step 1\nQM_VALIDATION {"devices_visible": 8, "nccl_busbw_gbps": 221.4, "dcgm_diag": "pass", "warmup_s": 31}\n'


def test_the_figures_come_from_the_last_result_line_of_a_finished_job() -> None:
    assert results_from_log(LOG) == {
        "devices_visible": 8,
        "nccl_busbw_gbps": 221.4,
        "dcgm_diag": "pass",
        "warmup_s": 31,
    }
    assert results_from_log("QM_VALIDATION not json") is None
    assert not validation_status_from_job(_job(), LOG).done
    done = validation_status_from_job(_job(("Complete", "")), LOG)
    assert done.done and done.results["nccl_busbw_gbps"] == 221.4 and not done.error
    silent = validation_status_from_job(_job(("Complete", "")), "nothing\n")
    assert silent.done and silent.error == "the validation printed no results"
    failed = validation_status_from_job(_job(("Failed", "DeadlineExceeded")), "")
    assert failed.done and failed.error == "Job failed: DeadlineExceeded"
    gone = validation_status_from_job(None, "")
    assert not gone.done and gone.missing  # relaunched by the portal


class _Core:
    def __init__(self) -> None:
        self.patches: list[tuple[str, dict]] = []

    def patch_node(self, name: str, body: dict) -> None:
        self.patches.append((name, body))


def test_node_changes_are_merge_patches_of_labels_and_unschedulable() -> None:
    core = _Core()
    backend = KubernetesBackend(core=core, batch=object())
    backend.node_patch("a100-03", {"nvidia.com/mig.config": "all-1g.10gb", "old": None}, True)
    backend.node_patch("a100-03", {}, False)
    assert core.patches == [
        (
            "a100-03",
            {
                "metadata": {"labels": {"nvidia.com/mig.config": "all-1g.10gb", "old": None}},
                "spec": {"unschedulable": True},
            },
        ),
        ("a100-03", {"metadata": {"labels": {}}, "spec": {"unschedulable": False}}),
    ]


def _caps(container: dict[str, Any]) -> list[str]:
    return ((container.get("securityContext") or {}).get("capabilities") or {}).get("add") or []


def test_dcgm_diag_levels_2_and_up_get_sys_admin_on_the_container_that_runs_them() -> None:
    from dataclasses import replace

    dcgm = "nvcr.io/nvidia/cloud-native/dcgm:4.2.3-1-ubuntu22.04"
    for level in (1, 2, 3, 4):
        split = job_to_dict(validation_job_build(replace(SPEC, dcgm_level=level), "n:1", dcgm))
        pod = split["spec"]["template"]["spec"]
        [init], [main] = pod["initContainers"], pod["containers"]
        # Level 1 stays within Pod Security "baseline"; nccl-tests never needs the capability.
        assert _caps(init) == (["SYS_ADMIN"] if level >= 2 else []), level
        assert _caps(main) == []
        assert not (init.get("securityContext") or {}).get("privileged")
        one = job_to_dict(validation_job_build(replace(SPEC, dcgm_level=level), "n:1"))
        [main] = one["spec"]["template"]["spec"]["containers"]
        assert _caps(main) == (["SYS_ADMIN"] if level >= 2 else []), level
