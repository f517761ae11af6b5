"""The per-node burn-in Job (docs/lifecycle.md): DCGM diagnostics (`dcgmi diag`, level from
the thresholds), device visibility and nccl-tests' all-reduce, on every GPU of one cordoned
node. The defaults are NVIDIA's DCGM image and a published nccl-tests image (VALIDATION_*).

The pod prints one line `QM_VALIDATION {json}` with its figures and, when the portal is
reachable, POSTs the same JSON to its report URL; the portal judges them against the
thresholds (`portal.lib.lifecycle.verdict`), never the pod.
"""

from __future__ import annotations

import json
from typing import Any

from kubernetes import client

from portal.backends.base import VALIDATION_RESULT_PREFIX, ValidationSpec, ValidationStatus
from portal.k8s.names import L_COMPONENT, L_INSTANCE, L_MANAGED_BY, MAIN_CONTAINER, MANAGED_BY

#: the DCGM image's part (an init container): `dcgmi diag` at the asked level, its verdict
#: left in the shared /results for the main container
DCGM_SCRIPT = r"""
set -u
nv-hostengine -n >/dev/null 2>&1 &
sleep 2
if dcgmi diag -r "${QM_DCGM_LEVEL:-1}" >/tmp/diag 2>&1; then echo pass >/results/diag
else echo "fail: $(grep -m1 -i fail /tmp/diag | tr -d '"\\')" >/results/diag; fi
"""

#: the nccl-tests image's part: device visibility, the all-reduce, and the report; with no
#: DCGM image set the main image runs `dcgmi diag` itself (one image carrying both)
SCRIPT = r"""
set -u
visible=$(nvidia-smi -L | grep -c '^GPU ')
busbw=$(all_reduce_perf -b 64M -e 1G -f 2 -g "$visible" | awk '/Avg bus bandwidth/ {print $NF}')
if [ -s /results/diag ]; then diag=$(cat /results/diag)
elif dcgmi diag -r "${QM_DCGM_LEVEL:-1}" >/tmp/diag 2>&1; then diag=pass
else diag="fail: $(grep -m1 -i fail /tmp/diag | tr -d '"\\')"; fi
result=$(printf '{"devices_visible": %s, "nccl_busbw_gbps": %s, "dcgm_diag": "%s"}' \
  "$visible" "${busbw:-0}" "$diag")
echo "QM_VALIDATION $result"
if [ -n "${QM_REPORT_URL:-}" ] && command -v curl >/dev/null; then
  curl -fsS -X POST -H "Authorization: Bearer $QM_REPORT_TOKEN" \
    -H 'Content-Type: application/json' -d "$result" "$QM_REPORT_URL" || true
fi
"""


#: `dcgmi diag` levels from which NVIDIA runs the DCGM container with CAP_SYS_ADMIN (the
#: memory, PCIe and stress plugins); level 1 runs without it, within Pod Security "baseline"
SYS_ADMIN_FROM_LEVEL = 2


def _diag_security(level: int) -> client.V1SecurityContext | None:
    """The capability the diagnostics at `level` need, and nothing more (never privileged)."""
    if level < SYS_ADMIN_FROM_LEVEL:
        return None
    return client.V1SecurityContext(capabilities=client.V1Capabilities(add=["SYS_ADMIN"]))


def validation_job_build(spec: ValidationSpec, image: str, dcgm_image: str = "") -> client.V1Job:
    """One pod on `spec.node` (by hostname, tolerating the cordon and any taint), all its GPUs:
    `dcgmi diag` first from `dcgm_image` (NVIDIA's DCGM image), then nccl-tests from `image`.
    Whichever container runs `dcgmi diag` gets SYS_ADMIN from level 2 (`SYS_ADMIN_FROM_LEVEL`)."""
    diag_security = _diag_security(spec.dcgm_level)
    counts = {k: str(v) for k, v in spec.resources}
    labels = {L_MANAGED_BY: MANAGED_BY, L_INSTANCE: spec.name, L_COMPONENT: "validation"}
    env = [
        client.V1EnvVar(name="QM_REPORT_URL", value=spec.report_url),
        client.V1EnvVar(name="QM_REPORT_TOKEN", value=spec.token),
        client.V1EnvVar(name="QM_DCGM_LEVEL", value=str(spec.dcgm_level)),
    ]
    results = client.V1VolumeMount(name="results", mount_path="/results")
    resources = client.V1ResourceRequirements(requests=counts, limits=counts)
    init = (
        [
            client.V1Container(
                name="dcgm-diag",
                image=dcgm_image,
                command=["/bin/bash", "-c", DCGM_SCRIPT],
                env=env[2:],
                resources=resources,
                security_context=diag_security,
                volume_mounts=[results],
            )
        ]
        if dcgm_image
        else None
    )
    pod = client.V1PodSpec(
        restart_policy="Never",
        automount_service_account_token=False,
        node_selector={"kubernetes.io/hostname": spec.node},
        # The node is cordoned for its validation; its GPU taints are the pool's.
        tolerations=[client.V1Toleration(operator="Exists")],
        volumes=[client.V1Volume(name="results", empty_dir=client.V1EmptyDirVolumeSource())],
        init_containers=init,
        containers=[
            client.V1Container(
                name=MAIN_CONTAINER,
                image=image,
                command=["/bin/bash", "-c", SCRIPT],
                env=env,
                resources=resources,
                # With no DCGM image the main container runs `dcgmi diag` itself.
                security_context=None if dcgm_image else diag_security,
                volume_mounts=[results],
            )
        ],
    )
    return client.V1Job(
        api_version="batch/v1",
        kind="Job",
        metadata=client.V1ObjectMeta(name=spec.name, namespace=spec.namespace, labels=labels),
        spec=client.V1JobSpec(
            backoff_limit=0,
            ttl_seconds_after_finished=86400,
            active_deadline_seconds=1800,
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=labels), spec=pod
            ),
        ),
    )


def results_from_log(text: str) -> dict[str, Any] | None:
    """The figures of the last `QM_VALIDATION` line of a log (None: no such line)."""
    for line in reversed(text.splitlines()):
        if line.startswith(VALIDATION_RESULT_PREFIX):
            try:
                data = json.loads(line[len(VALIDATION_RESULT_PREFIX) :])
            except ValueError:
                return None
            return data if isinstance(data, dict) else None
    return None


def validation_status_from_job(job: Any, log_text: str) -> ValidationStatus:
    """Done when the Job finished: with the figures of its log, or failed with its reason."""
    if job is None:
        return ValidationStatus(done=False, missing=True)
    for cond in job.status.conditions or () if job.status else ():
        if cond.status != "True":
            continue
        if cond.type == "Complete":
            results = results_from_log(log_text)
            if results is None:
                return ValidationStatus(done=True, error="the validation printed no results")
            return ValidationStatus(done=True, results=results)
        if cond.type == "Failed":
            results = results_from_log(log_text)
            why = cond.message or cond.reason or "failed"
            return ValidationStatus(done=True, results=results or {}, error=f"Job failed: {why}")
    return ValidationStatus(done=False)
