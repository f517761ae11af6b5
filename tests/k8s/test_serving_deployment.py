"""Serving on Kubernetes: a serving workload is a Deployment and a Service; a
revision change rolls the replicas over; readiness is the model warmed up."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import kubernetes_validate
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from portal.backends.base import GrantSpec, Outcome, PodLaunch, ServingSpec
from portal.k8s.jobs import job_to_dict
from portal.k8s.serving import L_REVISION, L_WORKLOAD, deployment_build
from tests.k8s.builders import OPTIONS, backend, cluster_with_nodes, spec
from tests.k8s.test_job_build import KUBE_VERSION


def serving_spec() -> Any:
    return replace(
        spec(),
        name="qm-42-1",
        workload_class="inference",
        max_runtime_s=0,
        pods=(
            PodLaunch(0, "gpu-a", (GrantSpec(0, 1000),)),
            PodLaunch(1, "gpu-b", (GrantSpec(0, 1000),)),
        ),
        serving=ServingSpec("llama-3-8b", "r1", "vllm", 0.5),
    )


class FakeApps:
    """AppsV1Api's Deployment calls, kept in a dict."""

    def __init__(self) -> None:
        self.deployments: dict[tuple[str, str], client.V1Deployment] = {}
        self.patches: list[dict[str, Any]] = []

    def create_namespaced_deployment(self, namespace: str, body: Any) -> Any:
        key = (namespace, body.metadata.name)
        if key in self.deployments:
            raise ApiException(status=409)
        body.status = client.V1DeploymentStatus(ready_replicas=0)
        self.deployments[key] = body
        return body

    def read_namespaced_deployment(self, name: str, namespace: str) -> Any:
        if (namespace, name) not in self.deployments:
            raise ApiException(status=404)
        return self.deployments[(namespace, name)]

    def patch_namespaced_deployment(self, name: str, namespace: str, body: Any) -> Any:
        self.read_namespaced_deployment(name, namespace)
        self.patches.append(body)
        return self.deployments[(namespace, name)]

    def delete_namespaced_deployment(self, name: str, namespace: str) -> Any:
        self.read_namespaced_deployment(name, namespace)
        del self.deployments[(namespace, name)]


def test_the_deployment_spreads_pinned_replicas_with_a_warm_up_readiness_probe() -> None:
    deployment, service = deployment_build(serving_spec(), OPTIONS, lambda n: None)
    d = job_to_dict(deployment)
    kubernetes_validate.validate(d, KUBE_VERSION, strict=True)
    kubernetes_validate.validate(job_to_dict(service), KUBE_VERSION, strict=True)
    assert d["kind"] == "Deployment" and d["spec"]["replicas"] == 2
    pod = d["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Always"
    term = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == ["gpu-a", "gpu-b"]
    spread = pod["topologySpreadConstraints"][0]
    assert spread["maxSkew"] == 1 and spread["whenUnsatisfiable"] == "DoNotSchedule"
    main = pod["containers"][0]
    assert main["readinessProbe"]["httpGet"] == {"path": "/health", "port": 8000}
    env = {e["name"]: e["value"] for e in main["env"]}
    assert env["QM_MODEL_REVISION"] == "r1" and env["QM_MODEL_NAME"] == "llama-3-8b"
    labels = d["spec"]["template"]["metadata"]["labels"]
    assert labels[L_WORKLOAD] == "qm-42" and labels[L_REVISION] == "r1"
    # never more pods than devices granted during a rollover
    assert d["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    assert job_to_dict(service)["spec"]["selector"] == d["spec"]["selector"]["matchLabels"]


def test_launch_rollout_status_and_stop_through_the_backend() -> None:
    cluster = cluster_with_nodes()
    apps = FakeApps()
    b = backend(cluster, apps=apps)
    s = serving_spec()
    b.launch(s)
    b.launch(s)  # a retried launch adopts it
    dep = apps.deployments[(s.namespace, s.name)]
    assert dep.metadata.owner_references[0].kind == "Service"
    assert b.status(s.name, s.namespace, pods=2).outcome is Outcome.PENDING  # warming up
    dep.status.ready_replicas = 1
    assert b.status(s.name, s.namespace, pods=2).outcome is Outcome.RUNNING
    b.rollout(s.name, s.namespace, 2, "r2")
    patch = apps.patches[-1]["spec"]["template"]
    assert patch["metadata"]["labels"][L_REVISION] == "r2"
    assert patch["spec"]["containers"][0]["env"] == [{"name": "QM_MODEL_REVISION", "value": "r2"}]
    b.stop(s.name, s.namespace, pods=2)
    assert not apps.deployments
    assert b.status(s.name, s.namespace, pods=2).outcome is Outcome.MISSING


def test_the_chart_scrapes_replicas_with_the_labels_the_queries_select() -> None:
    from tests.chart.chart import CASES, one, render

    monitor = one(render(CASES["everything"]), "PodMonitor", "qm-quartermaster-serving")
    endpoints = monitor["spec"]["podMetricsEndpoints"]
    assert [e["port"] for e in endpoints] == ["http", "metrics"]
    targets = {r["targetLabel"]: r["sourceLabels"][0] for r in endpoints[0]["relabelings"]}
    assert targets["workload"] == "__meta_kubernetes_pod_label_quartermaster_io_workload"
    assert set(targets) == {"team", "workload", "pool", "class", "model_name", "model_revision"}
    triton = replace(serving_spec(), serving=ServingSpec("m", "r1", "triton"))
    deployment, _ = deployment_build(triton, OPTIONS, lambda n: None)
    ports = job_to_dict(deployment)["spec"]["template"]["spec"]["containers"][0]["ports"]
    assert {p["name"]: p["containerPort"] for p in ports} == {"http": 8000, "metrics": 8002}


def test_without_prometheus_the_portal_reads_ready_replica_pods() -> None:
    """The fallback samples on Kubernetes: each ready replica's metrics port, by pod IP."""
    import socket
    import urllib.request

    from portal.backends.serving_sim import Engine, serve
    from portal.k8s.serving import serving_replica_endpoints
    from portal.services import serving_samples as serving_metrics

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = serve(
        Engine("vllm", {"model_revision": "r2"}, max_batch=8, rps=5, warmup_s=0), "127.0.0.1", port
    )

    def pod(name: str, ready: str, ip: str | None) -> client.V1Pod:
        return client.V1Pod(
            metadata=client.V1ObjectMeta(name=name, labels={L_REVISION: "r2"}),
            spec=client.V1PodSpec(
                containers=[
                    client.V1Container(
                        name="main",
                        ports=[client.V1ContainerPort(name="http", container_port=port)],
                    )
                ]
            ),
            status=client.V1PodStatus(
                pod_ip=ip, conditions=[client.V1PodCondition(type="Ready", status=ready)]
            ),
        )

    try:
        endpoints = serving_replica_endpoints(
            [pod("a", "True", "127.0.0.1"), pod("b", "False", "10.0.0.2"), pod("c", "True", None)]
        )
        assert endpoints == [{"host": "127.0.0.1", "port": port, "revision": "r2"}]
        url = f"http://{endpoints[0]['host']}:{endpoints[0]['port']}/metrics"
        with urllib.request.urlopen(url) as resp:
            scraped = serving_metrics.parse_scrape(resp.read().decode(), "vllm")
        assert scraped["revision"] == "r2" and "ttft" in scraped and "waiting" in scraped
    finally:
        server.shutdown()
