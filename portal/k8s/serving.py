"""A serving workload on Kubernetes: a Deployment of its replicas and a Service in front.

The pod template is the attempt's Job pod (`jobs.job_build`: resources, security,
tolerations, the readiness init container), changed where serving differs:

* it restarts (`restartPolicy: Always`): a server runs until stopped;
* required node affinity to the nodes the packer chose for the replicas (`spread`),
  and a topology spread of one replica per node, so each replica lands on its own;
* a readinessProbe on the server's `/health`: a replica is ready once its model is
  warmed up (vLLM, TGI and Triton all answer it only then), and a rolling update waits
  for each new replica to be ready before it stops an old one (`maxUnavailable: 0`);
* the model, its revision and the runtime in the environment and in pod labels, so a
  revision change (a new template) rolls the replicas over, and every scraped series
  carries team, workload, pool, class and model revision (docs/metrics.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from kubernetes import client

from portal.backends.base import LaunchSpec, Outcome, WorkloadStatus
from portal.k8s.jobs import JobOptions, job_build
from portal.k8s.names import L_INSTANCE, LABEL_HOSTNAME, LaunchRefused, built, label_value

L_MODEL = "quartermaster.io/model"
L_REVISION = "quartermaster.io/model-revision"
L_RUNTIME = "quartermaster.io/runtime"
L_WORKLOAD = "quartermaster.io/workload"
SERVING_PORT = 8000
#: the server's readiness endpoint (vLLM, TGI and Triton's HTTP front ends all have /health
#: or its equivalent once the model is loaded)
HEALTH_PATH = {"vllm": "/health", "tgi": "/health", "triton": "/v2/health/ready"}
METRICS_PORT = {"vllm": SERVING_PORT, "tgi": SERVING_PORT, "triton": 8002}


def serving_labels(spec: LaunchSpec) -> dict[str, str]:
    s = spec.serving
    assert s is not None
    return {
        # the request, stable across its attempts (the selector of its queries)
        L_WORKLOAD: f"qm-{spec.request_id}",
        L_MODEL: label_value(s.model.replace("/", ".")),
        L_REVISION: label_value(s.revision.replace("/", ".")),
        L_RUNTIME: s.runtime,
    }


def deployment_build(
    spec: LaunchSpec,
    options: JobOptions,
    facts: Callable[[str], Mapping[str, Any] | None],
) -> tuple[client.V1Deployment, client.V1Service]:
    if spec.serving is None:
        raise LaunchRefused("not a serving workload")
    nodes = [p.node for p in spec.pods] or [spec.node]
    first = spec.members()[0]
    one = replace(first, pods=(), gang="", rank=0, world_size=1, name=spec.name)
    job = job_build(one, options, facts(one.node))
    job_meta = built(job.metadata)
    template = built(job.spec).template
    template_meta = built(template.metadata)
    extra = serving_labels(spec)
    template_meta.labels = {**built(template_meta.labels), **extra}
    pod = built(template.spec)
    pod.restart_policy = "Always"
    hostnames = [str((facts(n) or {}).get("hostname") or n) for n in nodes]
    node_affinity = built(built(pod.affinity).node_affinity)
    term = built(node_affinity.required_during_scheduling_ignored_during_execution)
    built(term.node_selector_terms[0].match_expressions)[0].values = hostnames
    pod.topology_spread_constraints = [
        client.V1TopologySpreadConstraint(
            max_skew=1,
            topology_key=LABEL_HOSTNAME,
            when_unsatisfiable="DoNotSchedule",
            label_selector=client.V1LabelSelector(match_labels={L_INSTANCE: spec.name}),
        )
    ]
    s = spec.serving
    main = pod.containers[0]
    main.env = [
        *(main.env or []),
        client.V1EnvVar(name="QM_MODEL_NAME", value=s.model),
        client.V1EnvVar(name="QM_MODEL_REVISION", value=s.revision),
        client.V1EnvVar(name="QM_SERVING_RUNTIME", value=s.runtime),
    ]
    main.ports = [client.V1ContainerPort(name="http", container_port=SERVING_PORT)]
    if METRICS_PORT[s.runtime] != SERVING_PORT:
        # Triton serves /metrics on a port of its own; the PodMonitor scrapes "metrics".
        main.ports.append(
            client.V1ContainerPort(name="metrics", container_port=METRICS_PORT[s.runtime])
        )
    main.readiness_probe = client.V1Probe(
        http_get=client.V1HTTPGetAction(path=HEALTH_PATH[s.runtime], port=SERVING_PORT),
        period_seconds=5,
        failure_threshold=3,
    )
    # Loading a model takes minutes: the liveness clock starts once it is ready.
    main.startup_probe = client.V1Probe(
        http_get=client.V1HTTPGetAction(path=HEALTH_PATH[s.runtime], port=SERVING_PORT),
        period_seconds=10,
        failure_threshold=90,
    )
    labels = {**built(job_meta.labels), **extra}
    selector = {L_INSTANCE: spec.name}
    deployment = client.V1Deployment(
        api_version="apps/v1",
        kind="Deployment",
        metadata=client.V1ObjectMeta(
            name=spec.name,
            namespace=spec.namespace,
            labels=labels,
            annotations=job_meta.annotations,
        ),
        spec=client.V1DeploymentSpec(
            replicas=len(nodes),
            selector=client.V1LabelSelector(match_labels=selector),
            # Never more pods than devices granted: one replaced at a time, the new one
            # only once the old is gone (maxSurge 0) … but never below the ready count
            # the packer planned either, so: one unavailable at a time.
            strategy=client.V1DeploymentStrategy(
                type="RollingUpdate",
                rolling_update=client.V1RollingUpdateDeployment(max_surge=0, max_unavailable=1),
            ),
            min_ready_seconds=5,
            template=template,
        ),
    )
    service = client.V1Service(
        api_version="v1",
        kind="Service",
        metadata=client.V1ObjectMeta(
            name=spec.name,
            namespace=spec.namespace,
            labels=labels,
            annotations={
                "prometheus.io/scrape": "true",
                "prometheus.io/port": str(METRICS_PORT[s.runtime]),
            },
        ),
        spec=client.V1ServiceSpec(
            selector=selector,
            ports=[client.V1ServicePort(name="http", port=SERVING_PORT, target_port="http")],
        ),
    )
    return deployment, service


def rollout_patch(revision: str) -> dict[str, Any]:
    """The strategic-merge patch that moves a Deployment to `revision` (a rolling update)."""
    return {
        "metadata": {"labels": {L_REVISION: label_value(revision.replace("/", "."))}},
        "spec": {
            "template": {
                "metadata": {"labels": {L_REVISION: label_value(revision.replace("/", "."))}},
                "spec": {
                    "containers": [
                        {"name": "main", "env": [{"name": "QM_MODEL_REVISION", "value": revision}]}
                    ]
                },
            }
        },
    }


def serving_status(deployment: Any, name: str, namespace: str) -> WorkloadStatus:
    """A Deployment's state as an attempt's: running once any replica is ready (it serves),
    pending before."""
    st = deployment.status
    ready = int(getattr(st, "ready_replicas", 0) or 0) if st else 0
    want = int(getattr(deployment.spec, "replicas", 0) or 0)
    if ready > 0:
        return WorkloadStatus(
            name, namespace, Outcome.RUNNING, message=f"{ready}/{want} replicas ready"
        )
    return WorkloadStatus(
        name, namespace, Outcome.PENDING, message=f"0/{want} replicas ready: warming up"
    )


def serving_replica_endpoints(pods: list[Any]) -> list[dict[str, Any]]:
    """host, port (the metrics port) and revision of each ready replica pod."""
    out = []
    for pod in pods:
        st = pod.status
        ready = any(c.type == "Ready" and c.status == "True" for c in (st.conditions or []) if st)
        if not ready or not st.pod_ip or pod.metadata.deletion_timestamp:
            continue
        ports = {p.name: p.container_port for c in pod.spec.containers for p in (c.ports or [])}
        port = ports.get("metrics") or ports.get("http")
        if port:
            out.append(
                {
                    "host": st.pod_ip,
                    "port": port,
                    "revision": (pod.metadata.labels or {}).get(L_REVISION, ""),
                }
            )
    return out
