"""charts/quartermaster rendered offline, with default and non-default values.

Rendering uses helm-python-sdk (the Helm 4 SDK in a shared library, no helm binary
and no cluster: `lookup` returns nothing). Every manifest is validated with
kubernetes-validate --strict against Kubernetes 1.32; ServiceMonitor and
PrometheusRule come from CRDs it has no schema for, so they are skipped there
and checked by their own tests (and the rules by promtool, test_alerts.py).
The assertions keep the chart installable and least-privileged: strict lint and schema,
stable selectors, RBAC and writes confined to team namespaces, restricted pods, secrets
generated or taken from an existing one, metrics behind a token, and values mapped onto
the portal's environment.
"""

from __future__ import annotations

import base64
import json

import helm_python as helm
import kubernetes_validate
import pytest

from tests.chart.chart import (
    CASES,
    CHART,
    CRD_KINDS,
    EXTERNAL,
    NAMESPACE,
    kinds,
    one,
    pod_specs,
    render,
    render_files,
)
from tests.k8s.pss import restricted_violations

KUBE_VERSION = "1.32.0"
FULL = "qm-quartermaster"


@pytest.fixture(params=sorted(CASES))
def case(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_it_lints_strictly(case: str) -> None:
    report = helm.lint(CHART, CASES[case], strict=True, kube_version=KUBE_VERSION)
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_every_manifest_validates_strictly(case: str) -> None:
    docs = render(CASES[case])
    assert docs
    for doc in docs:
        if doc["kind"] in CRD_KINDS:
            continue
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)


def test_only_crd_kinds_are_skipped() -> None:
    seen = {d["kind"] for d in render(CASES["everything"])}
    assert seen & CRD_KINDS == CRD_KINDS
    assert {
        "Deployment",
        "DaemonSet",
        "StatefulSet",
        "Job",
        "ClusterRole",
        "Role",
        "Namespace",
        "ResourceQuota",
        "ValidatingAdmissionPolicy",
        "PriorityClass",
        "Ingress",
    } <= seen


def test_it_needs_a_database_and_a_broker() -> None:
    """`required` values: rendering fails without them (lint only warns, so render too)."""
    with pytest.raises(helm.HelmRenderError, match="externalDatabase.url"):
        render({})
    with pytest.raises(helm.HelmRenderError, match="externalRedis.url"):
        render({"externalDatabase": EXTERNAL["externalDatabase"]})


@pytest.mark.parametrize(
    "bad",
    [
        {"web": {"replicas": "two"}},
        {"config": {"clusterBackend": "slurm"}},
        {"teams": [{"name": "Team A"}]},
        {"teams": [{"name": "a", "quota": {"nvidia.com/gpu": "1"}}]},
        {"teams": [{"name": "a", "quota": {"limits.nvidia.com/gpu": "1"}}]},
        {"metrics": {"prometheusRule": {"thresholds": {"tickSkippedRatio": 2}}}},
        {"typo": True},
    ],
)
def test_the_schema_rejects_bad_values(bad: dict) -> None:
    with pytest.raises(helm.HelmValuesError):
        helm.Chart.load(CHART).validate_schema({**EXTERNAL, **bad})


def test_selector_labels_are_stable_across_upgrades() -> None:
    """Selectors are immutable: only name, instance (and component) — no version, no chart."""
    before = {
        f"{d['kind']}/{d['metadata']['name']}": d["spec"]["selector"]
        for d in render(CASES["defaults"])
        if d["kind"] in ("Deployment", "StatefulSet", "DaemonSet")
    }
    after = {
        f"{d['kind']}/{d['metadata']['name']}": d["spec"]["selector"]
        for d in render({**CASES["defaults"], "image": {"tag": "9.9.9"}, "web": {"replicas": 5}})
        if d["kind"] in ("Deployment", "StatefulSet", "DaemonSet")
    }
    assert before == after
    for selector in before.values():
        assert set(selector["matchLabels"]) == {
            "app.kubernetes.io/name",
            "app.kubernetes.io/instance",
            "app.kubernetes.io/component",
        }
    for d in render(CASES["everything"]):
        labels = d["metadata"]["labels"]
        assert (
            labels["app.kubernetes.io/instance"] == "qm"
            and labels["app.kubernetes.io/managed-by"] == "Helm"
        )
        assert labels["helm.sh/chart"] == "quartermaster-0.1.0"


def test_rbac_is_least_privilege(case: str) -> None:
    docs = render(CASES[case])
    for role in kinds(docs, "ClusterRole") + kinds(docs, "Role"):
        for rule in role["rules"]:
            for key in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[key], role["metadata"]["name"]
            assert not set(rule["resources"]) & {
                "secrets",
                "pods/exec",
                "pods/attach",
                "pods/portforward",
                "nodes/proxy",
                "serviceaccounts/token",
                "configmaps",
            }
            assert "rbac.authorization.k8s.io" not in rule["apiGroups"]
            assert not set(rule["verbs"]) & {"escalate", "bind", "impersonate"}
            if "pods" in rule["resources"]:
                assert set(rule["verbs"]) <= {"get", "list", "watch"}
    for role in kinds(docs, "ClusterRole"):
        for rule in role["rules"]:
            assert set(rule["verbs"]) <= {"get", "list", "watch"}, (
                "cluster-wide access is read-only"
            )
    assert not kinds(docs, "ClusterRoleBinding") or all(
        b["roleRef"]["name"] == f"{FULL}-node-reader" for b in kinds(docs, "ClusterRoleBinding")
    )


def team_roles(docs: list[dict]) -> list[dict]:
    """The Roles in team namespaces (the release namespace has the provisioner's)."""
    return [r for r in kinds(docs, "Role") if r["metadata"]["name"].endswith("-job-manager")]


def test_jobs_are_written_only_in_team_namespaces() -> None:
    docs = render(CASES["everything"])
    roles = {
        r["metadata"]["namespace"]: r
        for r in kinds(docs, "Role")
        if r["metadata"]["name"].endswith("-job-manager")
    }
    assert sorted(roles) == ["research-b", "team-a", "team-c"]
    for ns, role in roles.items():
        jobs = next(r for r in role["rules"] if r["resources"] == ["jobs"])
        assert jobs["apiGroups"] == ["batch"] and jobs["verbs"] == [
            "create",
            "get",
            "list",
            "watch",
            "delete",
        ]
        binding = next(b for b in kinds(docs, "RoleBinding") if b["metadata"]["namespace"] == ns)
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": FULL, "namespace": NAMESPACE}
        ]
        assert binding["roleRef"]["kind"] == "Role"


def test_a_gangs_jobset_is_written_only_in_team_namespaces() -> None:
    """A gang is one JobSet where its CRD is installed (K8S_GANG_API=auto, the default)."""
    docs = render(CASES["everything"])
    for role in team_roles(docs):
        [rule] = [r for r in role["rules"] if r["resources"] == ["jobsets"]]
        assert rule == {
            "apiGroups": ["jobset.x-k8s.io"],
            "resources": ["jobsets"],
            "verbs": ["create", "get", "delete"],
        }
    assert one(docs, "ConfigMap", f"{FULL}-config")["data"]["K8S_GANG_API"] == "auto"
    jobs = render({**CASES["everything"], "config": {"gangApi": "jobs"}})
    assert one(jobs, "ConfigMap", f"{FULL}-config")["data"]["K8S_GANG_API"] == "jobs"


def test_provisioning_requests_are_written_in_team_namespaces() -> None:
    """The autoscaler reads a pod's consume annotation in the pod's namespace: the asks for
    a team's requests are written there; an ask naming no request (min_nodes) in the
    release namespace. Nowhere else, and never their status (the autoscaler's)."""
    docs = render(CASES["everything"])
    wanted = [
        ([""], ["podtemplates"], ["create", "get", "delete"]),
        (["autoscaling.x-k8s.io"], ["provisioningrequests"], ["create", "get", "list", "delete"]),
    ]

    def asks(role: dict) -> list:
        return [
            (r["apiGroups"], r["resources"], r["verbs"])
            for r in role["rules"]
            if r["resources"] in (["podtemplates"], ["provisioningrequests"])
        ]

    granted = {r["metadata"]["namespace"]: asks(r) for r in kinds(docs, "Role") if asks(r)}
    assert granted == {ns: wanted for ns in ("research-b", "team-a", "team-c", NAMESPACE)}
    role = one(docs, "Role", f"{FULL}-provisioner")
    assert role["metadata"]["namespace"] == NAMESPACE
    binding = one(docs, "RoleBinding", f"{FULL}-provisioner")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": FULL, "namespace": NAMESPACE}]
    config = one(docs, "ConfigMap", f"{FULL}-config")["data"]
    assert config["K8S_PROVISIONING_NAMESPACE"] == NAMESPACE
    off = render({**CASES["everything"], "rbac": {"provisioningRequests": False}})
    assert not [r for r in kinds(off, "Role") if asks(r)]
    assert not [r for r in kinds(off, "Role") if r["metadata"]["name"].endswith("-provisioner")]


def test_cluster_wide_pod_reading_is_optional() -> None:
    wide = one(render(CASES["everything"]), "ClusterRole", f"{FULL}-node-reader")
    narrow = one(render(CASES["existing-secret"]), "ClusterRole", f"{FULL}-node-reader")
    assert [r["resources"] for r in wide["rules"]] == [["nodes"], ["pods"]]
    assert [r["resources"] for r in narrow["rules"]] == [["nodes"]]
    config = one(render(CASES["existing-secret"]), "ConfigMap", f"{FULL}-config")["data"]
    assert config["K8S_POD_NAMESPACES"] == "team-a"


def test_team_namespaces_are_restricted_with_one_quota_each() -> None:
    docs = render(CASES["everything"])
    namespaces = {n["metadata"]["name"]: n for n in kinds(docs, "Namespace")}
    assert sorted(namespaces) == ["research-b", "team-a"]  # team-c brings its own namespace
    for ns in namespaces.values():
        labels = ns["metadata"]["labels"]
        for mode in ("enforce", "audit", "warn"):
            assert labels[f"pod-security.kubernetes.io/{mode}"] == "restricted"
            assert labels[f"pod-security.kubernetes.io/{mode}-version"] == "latest"
        assert labels["quartermaster.io/team-namespace"] == "true"
    quotas = kinds(docs, "ResourceQuota")
    assert sorted(q["metadata"]["namespace"] for q in quotas) == ["research-b", "team-a", "team-c"]
    team_a = next(q for q in quotas if q["metadata"]["namespace"] == "team-a")["spec"]["hard"]
    assert (
        team_a["requests.nvidia.com/gpu"] == "16"
        and team_a["requests.nvidia.com/mig-3g.40gb"] == "4"
    )
    for q in quotas:
        assert all(
            not k.startswith(("nvidia.com/", "limits.nvidia.com/")) for k in q["spec"]["hard"]
        )


def test_a_quota_without_the_requests_prefix_fails_to_render() -> None:
    values = {**EXTERNAL, "teams": [{"name": "a", "quota": {"limits.nvidia.com/gpu": "1"}}]}
    with pytest.raises((helm.HelmRenderError, helm.HelmValuesError)):
        render(values)


def test_the_admission_policy_guards_team_namespaces() -> None:
    docs = render(CASES["everything"])
    policy = one(docs, "ValidatingAdmissionPolicy", f"{FULL}-workload-guard")
    text = json.dumps(policy["spec"]["validations"])
    for needle in ("nodeName", "hostPath", "privileged", "NVIDIA_", "CUDA_VISIBLE_DEVICES"):
        assert needle in text
    binding = one(docs, "ValidatingAdmissionPolicyBinding", f"{FULL}-workload-guard")
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert binding["spec"]["matchResources"]["namespaceSelector"]["matchLabels"] == {
        "quartermaster.io/team-namespace": "true"
    }
    assert not kinds(render(CASES["existing-secret"]), "ValidatingAdmissionPolicy")


def test_every_pod_of_the_chart_is_restricted(case: str) -> None:
    for name, spec in pod_specs(render(CASES[case])).items():
        assert restricted_violations(spec) == [], name


def test_beat_is_exactly_one_and_recreated() -> None:
    beat = one(render(CASES["everything"]), "Deployment", f"{FULL}-beat")
    assert beat["spec"]["replicas"] == 1 and beat["spec"]["strategy"] == {"type": "Recreate"}
    assert beat["spec"]["template"]["spec"]["containers"][0]["command"][:4] == [
        "celery",
        "-A",
        "portal",
        "beat",
    ]


def test_worker_and_beat_probes_read_heartbeats_never_the_broker() -> None:
    docs = render(CASES["everything"])
    for name in ("worker", "beat"):
        container = one(docs, "Deployment", f"{FULL}-{name}")["spec"]["template"]["spec"][
            "containers"
        ][0]
        for probe, mode in (("livenessProbe", "--live"), ("readinessProbe", "--ready")):
            assert container[probe]["exec"]["command"] == [
                "python",
                "manage.py",
                "probe",
                name,
                mode,
            ]
    assert "inspect" not in str(docs)


def test_web_worker_and_migrations_run_the_right_commands() -> None:
    docs = render(CASES["everything"])
    web = one(docs, "Deployment", f"{FULL}-web")["spec"]["template"]["spec"]
    assert web["containers"][0]["command"][:2] == ["gunicorn", "portal.wsgi"]
    assert web["containers"][0]["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert web["initContainers"][0]["name"] == "wait-for-migrations"
    worker = one(docs, "Deployment", f"{FULL}-worker")["spec"]["template"]["spec"]
    assert worker["containers"][0]["command"][:4] == ["celery", "-A", "portal", "worker"]
    migrate = one(docs, "Job", f"{FULL}-migrate-1")["spec"]["template"]["spec"]
    assert migrate["containers"][0]["command"] == ["python", "manage.py", "migrate", "--noinput"]
    assert migrate["automountServiceAccountToken"] is False
    assert web["containers"][0]["image"] == "ghcr.io/quartermaster/portal:1.2.3"


def test_values_map_onto_the_portal_environment() -> None:
    docs = render(CASES["everything"])
    data = one(docs, "ConfigMap", f"{FULL}-config")["data"]
    assert data["CLUSTER_BACKEND"] == "kubernetes" and data["K8S_IN_CLUSTER"] == "true"
    assert data["TICK_SECONDS"] == "3" and data["HEARTBEAT_STALE_SECONDS"] == "120"
    assert data["IMAGE_PULL_TIMEOUT_SECONDS"] == "600" and data["DEBUG"] == "false"
    assert data["CSRF_TRUSTED_ORIGINS"] == "https://gpus.example.com"
    hosts = data["ALLOWED_HOSTS"].split(",")
    assert "gpus.example.com" in hosts and f"{FULL}-web.{NAMESPACE}.svc" in hosts
    assert data["K8S_PORTAL_URL"] == f"http://{FULL}-web.{NAMESPACE}.svc:8000"
    assert data["K8S_READY_IMAGE"] == "ghcr.io/quartermaster/portal:1.2.3"
    assert data["K8S_WATCH_NAMESPACES"] == "team-a,research-b,team-c"
    assert data["K8S_RUNTIME_CLASS"] == "nvidia" and data["K8S_IMAGE_PULL_SECRETS"] == "regcred"
    web = one(docs, "Deployment", f"{FULL}-web")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in web["env"]}
    for name in ("SECRET_KEY", "DATABASE_URL", "REDIS_URL", "NODE_AGENT_TOKEN", "METRICS_TOKEN"):
        assert env[f"{name}_FILE"] == f"/run/secrets/quartermaster/{name}"
    assert env["REQUEUE_LIMIT"] == "3"
    sim = one(render(CASES["simulated"]), "ConfigMap", f"{FULL}-config")["data"]
    assert sim["CLUSTER_BACKEND"] == "simulated" and sim["K8S_IN_CLUSTER"] == "false"


def test_throttles_trust_the_ingress_hop_only_behind_the_ingress() -> None:
    """NUM_PROXIES: 1 behind the chart's Ingress, 0 (the socket's address) without one."""
    behind = one(render(CASES["everything"]), "ConfigMap", f"{FULL}-config")["data"]
    assert behind["NUM_PROXIES"] == "1"
    direct = one(render(CASES["simulated"]), "ConfigMap", f"{FULL}-config")["data"]
    assert direct["NUM_PROXIES"] == "0"
    two = {**CASES["simulated"], "config": {**CASES["simulated"]["config"], "numProxies": 2}}
    assert one(render(two), "ConfigMap", f"{FULL}-config")["data"]["NUM_PROXIES"] == "2"


def test_secrets_are_generated_or_taken_from_an_existing_secret() -> None:
    docs = render(CASES["everything"])
    app = one(docs, "Secret", f"{FULL}-app")
    assert set(app["data"]) == {
        "SECRET_KEY",
        "DATABASE_URL",
        "REDIS_URL",
        "NODE_AGENT_TOKEN",
        "METRICS_TOKEN",
    }
    assert {s["metadata"]["name"] for s in kinds(docs, "Secret")} == {
        f"{FULL}-app",
        f"{FULL}-postgresql",
        f"{FULL}-redis",
    }
    existing = render(CASES["existing-secret"])
    assert not kinds(existing, "Secret")
    web = one(existing, "Deployment", f"{FULL}-web")["spec"]["template"]["spec"]
    assert (
        next(v for v in web["volumes"] if v["name"] == "secrets")["secret"]["secretName"]
        == "qm-secrets"
    )


def test_the_node_agent_runs_on_gpu_nodes_only_with_all_devices_visible() -> None:
    docs = render(CASES["everything"])
    ds = one(docs, "DaemonSet", f"{FULL}-node-agent")["spec"]["template"]["spec"]
    assert ds["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert ds["runtimeClassName"] == "nvidia" and ds["automountServiceAccountToken"] is False
    [agent] = ds["containers"]
    env = {e["name"]: e.get("value") for e in agent["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and env["NODE_AGENT_TOKEN_FILE"]
    assert agent["command"][:3] == ["python", "-m", "portal.node_agent"]
    assert not any(k.startswith("nvidia.com/") for k in agent["resources"].get("limits", {}))
    assert [i["key"] for i in ds["volumes"][0]["secret"]["items"]] == ["NODE_AGENT_TOKEN"]
    # no other workload of the chart sees GPUs
    for name, spec in pod_specs(docs).items():
        if "node-agent" in name:
            continue
        for c in spec["containers"] + spec.get("initContainers", []):
            assert not any(e["name"].startswith("NVIDIA_") for e in c.get("env", [])), name


def test_metrics_need_a_token_and_stay_off_the_ingress() -> None:
    """/metrics answered every team's numbers through the Ingress to anyone."""
    docs = render(CASES["everything"])
    app = one(docs, "Secret", f"{FULL}-app")
    assert len(base64.b64decode(app["data"]["METRICS_TOKEN"])) >= 32
    sm = one(docs, "ServiceMonitor", FULL)["spec"]["endpoints"][0]
    assert sm["authorization"] == {
        "type": "Bearer",
        "credentials": {"name": f"{FULL}-app", "key": "METRICS_TOKEN"},
    }
    web = one(docs, "Deployment", f"{FULL}-web")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in web["env"]}
    assert env["METRICS_TOKEN_FILE"]["value"] == "/run/secrets/quartermaster/METRICS_TOKEN"
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert web["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert web["livenessProbe"]["httpGet"]["path"] == "/healthz"
    web_service = one(docs, "Service", f"{FULL}-web")
    for ingress in kinds(docs, "Ingress"):
        for rule in ingress["spec"]["rules"]:
            paths = {p["path"]: p for p in rule["http"]["paths"]}
            blocked = paths["/metrics"]
            assert blocked["pathType"] in ("Prefix", "Exact")
            target = blocked["backend"]["service"]["name"]
            assert target != web_service["metadata"]["name"]
            hole = one(docs, "Service", target)
            assert "selector" not in hole["spec"]  # no endpoints: nothing answers


def test_monitoring_objects() -> None:
    docs = render(CASES["everything"])
    sm = one(docs, "ServiceMonitor", FULL)
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert sm["spec"]["endpoints"][0]["path"] == "/metrics"
    rule = one(docs, "PrometheusRule", FULL)
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    alerts = [r for g in rule["spec"]["groups"] for r in g["rules"]]
    names = {a["alert"] for a in alerts}
    assert {
        "QuartermasterQueueStalled",
        "QuartermasterAdmissionWaitHigh",
        "QuartermasterInferenceLatencyHigh",
        "QuartermasterSchedulerNoLeader",
        "QuartermasterTicksSkipped",
        "QuartermasterTickFailures",
        "QuartermasterNodeAgentStale",
    } <= names
    for a in alerts:
        assert a["labels"]["severity"] in ("critical", "warning", "info")
        assert {"summary", "description", "runbook_url"} <= set(a["annotations"])
    assert not kinds(render(CASES["defaults"]), "PrometheusRule")


def test_the_dashboard_is_portable() -> None:
    cm = one(render(CASES["everything"]), "ConfigMap", f"{FULL}-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    dash = json.loads(cm["data"]["quartermaster.json"])
    assert dash["uid"] == "quartermaster-overview" and isinstance(dash["schemaVersion"], int)
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert (
        variables["datasource"]["type"] == "datasource"
        and variables["datasource"]["query"] == "prometheus"
    )
    assert {"team", "node", "gpu"} <= set(variables)
    for panel in dash["panels"]:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert all(t["datasource"]["uid"] == "${datasource}" for t in panel["targets"])
    # switched off: no dashboard ConfigMap
    assert [c["metadata"]["name"] for c in kinds(render(CASES["simulated"]), "ConfigMap")] == [
        f"{FULL}-config"
    ]


def test_notes_render(case: str) -> None:
    notes = render_files(CASES[case])["quartermaster/templates/NOTES.txt"]
    assert "Quartermaster" in notes and f"{FULL}-web" in notes


def test_checkpoint_volumes_are_managed_in_team_namespaces_and_configured() -> None:
    docs = render(
        {
            **CASES["everything"],
            "config": {
                **CASES["everything"]["config"],
                "workloads": {
                    **CASES["everything"]["config"]["workloads"],
                    "checkpoints": {"storageClass": "ceph-rbd", "size": "200Gi"},
                },
            },
        }
    )
    for role in team_roles(docs):
        pvcs = next(r for r in role["rules"] if r["resources"] == ["persistentvolumeclaims"])
        assert pvcs["apiGroups"] == [""] and pvcs["verbs"] == ["create", "get", "delete"]
    data = one(docs, "ConfigMap", f"{FULL}-config")["data"]
    assert data["CHECKPOINT_STORAGE_CLASS"] == "ceph-rbd" and data["CHECKPOINT_SIZE"] == "200Gi"
    assert data["CHECKPOINT_ACCESS_MODE"] == "ReadWriteOnce"
    assert data["CHECKPOINT_PORTAL_URL"] == f"http://{FULL}-web.{NAMESPACE}.svc:8000"
    defaults = one(render(CASES["defaults"]), "ConfigMap", f"{FULL}-config")["data"]
    assert defaults["CHECKPOINT_STORAGE_CLASS"] == "" and defaults["CHECKPOINT_SIZE"] == "50Gi"


@pytest.mark.parametrize(
    "bad", [{"size": "lots"}, {"accessMode": "ReadOnlyMany"}, {"storageClas": "x"}]
)
def test_the_schema_rejects_bad_checkpoint_values(bad: dict) -> None:
    with pytest.raises(helm.HelmValuesError):
        helm.Chart.load(CHART).validate_schema(
            {**EXTERNAL, "config": {"workloads": {"checkpoints": bad}}}
        )


def test_team_namespaces_grant_reading_pod_logs_and_events() -> None:
    """The request page shows a workload's log tail and events (portal/k8s/logs.py)."""
    docs = render(CASES["everything"])
    for role in team_roles(docs):
        rules = {tuple(r["resources"]): set(r["verbs"]) for r in role["rules"]}
        assert "get" in rules[("pods/log",)], role["metadata"]["namespace"]
        assert "list" in rules[("events",)], role["metadata"]["namespace"]


def test_notifications_are_configured_from_values() -> None:
    """No mail host: the dummy backend (webhooks still go); a host: SMTP, password in the Secret."""
    docs = render(CASES["defaults"])
    config = next(d for d in kinds(docs, "ConfigMap") if d["metadata"]["name"].endswith("-config"))
    assert config["data"]["EMAIL_BACKEND"] == "django.core.mail.backends.dummy.EmailBackend"
    values = {
        **CASES["defaults"],
        "config": {
            **CASES["defaults"].get("config", {}),
            "notifications": {
                "portalURL": "https://gpus.example.com",
                "longWaitSeconds": 1800,
                "webhookAllowedNetworks": ["10.20.0.0/16", "fd00::/8"],
                "email": {
                    "host": "smtp.example.com",
                    "port": 587,
                    "useTLS": True,
                    "useSSL": False,
                    "user": "qm",
                    "from": "gpus@example.com",
                },
            },
        },
        "secrets": {**CASES["defaults"].get("secrets", {}), "emailPassword": "hunter2"},
    }
    docs = render(values)
    data = next(d for d in kinds(docs, "ConfigMap") if d["metadata"]["name"].endswith("-config"))[
        "data"
    ]
    assert data["EMAIL_BACKEND"] == "django.core.mail.backends.smtp.EmailBackend"
    assert (data["EMAIL_HOST"], data["EMAIL_PORT"], data["EMAIL_USE_TLS"]) == (
        "smtp.example.com",
        "587",
        "true",
    )
    assert data["PORTAL_URL"] == "https://gpus.example.com"
    assert data["NOTIFY_LONG_WAIT_SECONDS"] == "1800"
    assert data["NOTIFY_WEBHOOK_ALLOWED_NETWORKS"] == "10.20.0.0/16,fd00::/8"
    assert config["data"]["NOTIFY_WEBHOOK_ALLOWED_NETWORKS"] == ""
    assert "EMAIL_HOST_PASSWORD" not in data
    secret = next(d for d in kinds(docs, "Secret") if "EMAIL_HOST_PASSWORD" in d.get("data", {}))
    assert base64.b64decode(secret["data"]["EMAIL_HOST_PASSWORD"]) == b"hunter2"
    # ...and the portal reads it: a file in the secrets volume, named by EMAIL_HOST_PASSWORD_FILE.
    for workload in ("web", "worker"):
        pod = one(docs, "Deployment", f"{FULL}-{workload}")["spec"]["template"]["spec"]
        env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
        assert env["EMAIL_HOST_PASSWORD_FILE"] == "/run/secrets/quartermaster/EMAIL_HOST_PASSWORD"
        items = next(v for v in pod["volumes"] if v["name"] == "secrets")["secret"]["items"]
        assert {"key": "EMAIL_HOST_PASSWORD", "path": "EMAIL_HOST_PASSWORD"} in items
    # A user without a password is refused at render time, not as a pod stuck mounting it.
    del values["secrets"]["emailPassword"]
    with pytest.raises(helm.HelmRenderError, match="secrets.emailPassword"):
        render(values)


SSO_ENDPOINTS = {
    "clientId": "qm",
    "authorizationEndpoint": "https://sso.example.com/auth",
    "tokenEndpoint": "https://sso.example.com/token",
    "userinfoEndpoint": "https://sso.example.com/userinfo",
    "jwksEndpoint": "https://sso.example.com/jwks",
}


def test_single_sign_on_values_map_onto_the_portal_environment() -> None:
    from portal.settings import _group_map

    docs = render(CASES["sso"])
    data = one(docs, "ConfigMap", f"{FULL}-config")["data"]
    assert data["OIDC_RP_CLIENT_ID"] == "quartermaster"
    assert data["OIDC_OP_TOKEN_ENDPOINT"] == "https://sso.example.com/token"
    assert data["OIDC_PROVIDER_NAME"] == "Example SSO"
    assert data["PASSWORD_LOGIN"] == "false" and data["AUDITOR_GROUP"] == "auditors"
    # The portal's own parser reads what the chart wrote.
    assert _group_map(data["OIDC_GROUP_MAP"]) == [
        ("gpu-team-a", "team-a", "member"),
        ("gpu-leads-a", "team-a", "lead"),
        ("platform-admins", "*", "admin"),
        ("platform-auditors", "*", "auditor"),
    ]
    assert "OIDC_RP_CLIENT_SECRET" not in data
    secret = one(docs, "Secret", f"{FULL}-app")["data"]
    assert base64.b64decode(secret["OIDC_RP_CLIENT_SECRET"]).decode() == "client-secret"
    web = one(docs, "Deployment", f"{FULL}-web")["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in web["containers"][0]["env"]}
    assert env["OIDC_RP_CLIENT_SECRET_FILE"] == "/run/secrets/quartermaster/OIDC_RP_CLIENT_SECRET"
    items = next(v for v in web["volumes"] if v["name"] == "secrets")["secret"]["items"]
    assert {"key": "OIDC_RP_CLIENT_SECRET", "path": "OIDC_RP_CLIENT_SECRET"} in items
    # Off by default: no OIDC_* settings, no client secret, password login on.
    defaults = render(CASES["defaults"])
    data = one(defaults, "ConfigMap", f"{FULL}-config")["data"]
    assert not [k for k in data if k.startswith("OIDC_")] and data["PASSWORD_LOGIN"] == "true"
    assert "OIDC_RP_CLIENT_SECRET" not in one(defaults, "Secret", f"{FULL}-app")["data"]


def test_single_sign_on_needs_its_client_secret() -> None:
    with pytest.raises(helm.HelmRenderError, match="secrets.oidcClientSecret"):
        render({**EXTERNAL, "config": {"sso": SSO_ENDPOINTS}})


@pytest.mark.parametrize(
    "sso",
    [
        {"clientId": "qm"},  # no endpoints
        {"passwordLogin": False},  # no way in
        {**SSO_ENDPOINTS, "groupMap": [{"group": "admins", "team": "team-a", "role": "admin"}]},
        {**SSO_ENDPOINTS, "groupMap": [{"group": "gpu-a", "team": "*", "role": "member"}]},
        {**SSO_ENDPOINTS, "groupMap": [{"group": "gpu-a", "team": "team-a", "role": "owner"}]},
        {**SSO_ENDPOINTS, "groupMap": [{"group": "a:b", "team": "team-a", "role": "member"}]},
        {**SSO_ENDPOINTS, "tokenEndpoint": "sso.example.com/token"},
        {**SSO_ENDPOINTS, "scopes": "email groups"},
    ],
)
def test_the_schema_rejects_bad_single_sign_on_values(sso: dict) -> None:
    with pytest.raises(helm.HelmValuesError):
        helm.Chart.load(CHART).validate_schema({**EXTERNAL, "config": {"sso": sso}})


PROMETHEUS = {
    "url": "https://mimir.example.com/prometheus",
    "username": "portal",
    "caFile": "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt",
    "headers": {"X-Scope-OrgID": "gpu-cluster"},
}


def test_prometheus_values_map_onto_the_portal_environment() -> None:
    from portal.lib.prometheus import parse_headers

    values = {
        **EXTERNAL,
        "config": {"prometheus": PROMETHEUS},
        "secrets": {"prometheusPassword": "pw"},
    }
    docs = render(values)
    data = one(docs, "ConfigMap", f"{FULL}-config")["data"]
    assert data["PROMETHEUS_URL"] == PROMETHEUS["url"] and data["PROMETHEUS_USERNAME"] == "portal"
    assert data["PROMETHEUS_CA_FILE"] == PROMETHEUS["caFile"]
    # the portal's own parser reads what the chart wrote
    assert parse_headers(data["PROMETHEUS_HEADERS"]) == (("X-Scope-OrgID", "gpu-cluster"),)
    secret = one(docs, "Secret", f"{FULL}-app")["data"]
    assert base64.b64decode(secret["PROMETHEUS_PASSWORD"]).decode() == "pw"
    web = one(docs, "Deployment", f"{FULL}-web")["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in web["containers"][0]["env"]}
    assert env["PROMETHEUS_PASSWORD_FILE"] == "/run/secrets/quartermaster/PROMETHEUS_PASSWORD"
    with pytest.raises(helm.HelmRenderError, match="secrets.prometheusPassword"):
        render({**EXTERNAL, "config": {"prometheus": PROMETHEUS}})
    with pytest.raises(helm.HelmValuesError):
        helm.Chart.load(CHART).validate_schema(
            {**EXTERNAL, "config": {"prometheus": {"headers": {"X Bad": "a"}}}}
        )
    # off by default: the portal's own samples
    data = one(render(CASES["defaults"]), "ConfigMap", f"{FULL}-config")["data"]
    assert not [k for k in data if k.startswith("PROMETHEUS_")]
