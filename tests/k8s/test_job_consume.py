"""A Job whose attempt runs on nodes asked for through a ProvisioningRequest says so.

The cluster autoscaler books a provisioned request's capacity for the pods that name it
in their `consume-provisioning-request` annotation (docs/capacity.md); other pods carry
no such annotation."""

from __future__ import annotations

from typing import Any

from portal.backends.base import GrantSpec, PodLaunch
from portal.k8s.jobs import job_build, job_to_dict
from portal.k8s.provisioning import CONSUME, CONSUME_DEPRECATED
from tests.k8s.builders import OPTIONS, spec


def _pod_annotations(s: Any) -> dict[str, str]:
    return job_to_dict(job_build(s, OPTIONS))["spec"]["template"]["metadata"]["annotations"]


def test_the_pod_template_names_the_provisioning_request_its_nodes_were_asked_by() -> None:
    assert CONSUME == "autoscaling.x-k8s.io/consume-provisioning-request"
    job = job_to_dict(job_build(spec(provisioning_request="qm-a100-0123456789-2"), OPTIONS))
    pod = job["spec"]["template"]["metadata"]["annotations"]
    assert pod[CONSUME] == "qm-a100-0123456789-2"
    # Autoscalers from before the v1 key read the older one.
    assert pod[CONSUME_DEPRECATED] == "qm-a100-0123456789-2"
    # The autoscaler reads pods: the Job itself is left as it was.
    assert CONSUME not in job["metadata"]["annotations"]


def test_an_ordinary_attempt_carries_no_consume_annotation() -> None:
    pod = _pod_annotations(spec())
    assert CONSUME not in pod and CONSUME_DEPRECATED not in pod
    assert not any("provisioning-request" in k for k in pod)


def test_every_member_of_a_gang_consumes_its_atomic_request() -> None:
    g0, g1 = (GrantSpec(device=0, milli=1000),), (GrantSpec(device=0, milli=1000),)
    gang = spec(
        pods=(PodLaunch(0, "gpu-a", g0), PodLaunch(1, "gpu-b", g1)),
        provisioning_request="qm-a100-gang",
    )
    members = gang.members()
    assert len(members) == 2
    assert [_pod_annotations(m)[CONSUME] for m in members] == ["qm-a100-gang", "qm-a100-gang"]
