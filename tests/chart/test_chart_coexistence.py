"""The chart does not fight the portal (issue 30, item 6).

No PriorityClass lets kube-scheduler preempt behind the portal's back; a team's own people
read their pods and logs; the web, PostgreSQL and Redis answer only whom they must; replicas
spread and drain one at a time; probe timings are values; generated secrets can be the same
on every `helm template` (GitOps).
"""

from __future__ import annotations

import base64
import json
from typing import Any

import helm_python as helm
import pytest
import yaml

from tests.chart.chart import (
    CASES,
    CHART,
    EXTERNAL,
    NAMESPACE,
    RELEASE,
    kinds,
    one,
    render,
    render_files,
)

FULL = "qm-quartermaster"
SELECTOR = {"app.kubernetes.io/name": "quartermaster", "app.kubernetes.io/instance": "qm"}


@pytest.fixture(params=sorted(CASES))
def case(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_priority_classes_never_preempt(case: str) -> None:
    classes = kinds(render(CASES[case]), "PriorityClass")
    assert all(c["preemptionPolicy"] == "Never" for c in classes)
    if case == "everything":
        assert {c["metadata"]["name"] for c in classes} == {
            "quartermaster-inference",
            "quartermaster-interactive",
            "quartermaster-training",
        }
    # an item without the key still gets Never; the policy can be chosen explicitly
    items = [
        {"name": "a", "value": 5},
        {"name": "b", "value": 6, "preemptionPolicy": "PreemptLowerPriority"},
    ]
    docs = render({**EXTERNAL, "priorityClasses": {"create": True, "items": items}})
    policies = {c["metadata"]["name"]: c["preemptionPolicy"] for c in kinds(docs, "PriorityClass")}
    assert policies == {"a": "Never", "b": "PreemptLowerPriority"}


def test_a_teams_readers_read_pods_logs_and_events_in_its_namespace_only() -> None:
    docs = render(CASES["everything"])
    [role] = [r for r in kinds(docs, "Role") if r["metadata"]["name"] == f"{FULL}-team-reader"]
    assert role["metadata"]["namespace"] == "team-a"
    rules = {tuple(r["resources"]): set(r["verbs"]) for r in role["rules"]}
    assert rules == {("pods", "events"): {"get", "list", "watch"}, ("pods/log",): {"get"}}
    assert all(r["apiGroups"] == [""] for r in role["rules"])
    [binding] = [
        b for b in kinds(docs, "RoleBinding") if b["metadata"]["name"] == f"{FULL}-team-reader"
    ]
    assert binding["metadata"]["namespace"] == "team-a"
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": f"{FULL}-team-reader",
    }
    assert {(s["kind"], s["name"]) for s in binding["subjects"]} == {
        ("Group", "team-a-researchers"),
        ("User", "alice@example.com"),
    }
    # teams without readers get no binding; rbac.create=false writes none
    off = render({**CASES["everything"], "rbac": {"create": False}})
    assert not [r for r in kinds(off, "Role") if r["metadata"]["name"].endswith("-team-reader")]


def test_the_schema_rejects_bad_readers_and_seeds() -> None:
    chart = helm.Chart.load(CHART)
    for bad in (
        {"teams": [{"name": "t", "readers": {"groups": "not-a-list"}}]},
        {"teams": [{"name": "t", "readers": {"users": [""]}}]},
        {"teams": [{"name": "t", "readers": {"roles": ["admin"]}}]},
        {"secrets": {"seed": "short"}},
        {"web": {"probes": {"readiness": {"periodSeconds": 0}}}},
        {"worker": {"probes": {"liveness": {"exec": {"command": ["true"]}}}}},
        {"worker": {"topologySpreadConstraints": [{"maxSkew": 1}]}},
        {"networkPolicy": {"ingressNamespace": "Not A Namespace"}},
    ):
        with pytest.raises(helm.HelmValuesError):
            chart.validate_schema({**EXTERNAL, **bad})


def test_network_policies_admit_the_ingress_and_keep_the_databases_to_the_portal() -> None:
    docs = render(CASES["everything"])
    web = one(docs, "NetworkPolicy", f"{FULL}-web")["spec"]
    assert web["podSelector"]["matchLabels"] == {**SELECTOR, "app.kubernetes.io/component": "web"}
    assert web["policyTypes"] == ["Ingress"]
    [rule] = web["ingress"]
    assert rule["ports"] == [{"port": "http", "protocol": "TCP"}]
    peers = rule["from"]
    assert {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}}
    } in peers
    assert {"podSelector": {"matchLabels": SELECTOR}} in peers
    # the ServiceMonitor is on in this case: Prometheus's namespace may scrape
    assert {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}
    } in peers
    assert len(peers) == 3
    for component in ("postgresql", "redis"):
        spec = one(docs, "NetworkPolicy", f"{FULL}-{component}")["spec"]
        assert spec["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == component
        assert spec["ingress"] == [{"from": [{"podSelector": {"matchLabels": SELECTOR}}]}]
    # external databases: nothing to guard; the web's policy stays, without the metrics peer
    defaults = render(CASES["defaults"])
    assert {p["metadata"]["name"] for p in kinds(defaults, "NetworkPolicy")} == {f"{FULL}-web"}
    assert len(one(defaults, "NetworkPolicy", f"{FULL}-web")["spec"]["ingress"][0]["from"]) == 2
    extra = {"namespaceSelector": {"matchLabels": {"team": "ops"}}}
    more = render(
        {**EXTERNAL, "networkPolicy": {"ingressNamespace": "traefik", "extraWebFrom": [extra]}}
    )
    peers = one(more, "NetworkPolicy", f"{FULL}-web")["spec"]["ingress"][0]["from"]
    assert peers[0]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "traefik"
    }
    assert extra in peers
    assert not kinds(render({**EXTERNAL, "networkPolicy": {"enabled": False}}), "NetworkPolicy")


def test_web_and_worker_spread_and_drain_one_at_a_time() -> None:
    docs = render(CASES["everything"])
    for component in ("web", "worker"):
        spec = one(docs, "Deployment", f"{FULL}-{component}")["spec"]["template"]["spec"]
        own = {**SELECTOR, "app.kubernetes.io/component": component}
        spread = spec["topologySpreadConstraints"]
        assert [c["topologyKey"] for c in spread] == [
            "kubernetes.io/hostname",
            "topology.kubernetes.io/zone",
        ]
        for c in spread:
            assert c["labelSelector"] == {"matchLabels": own}
            assert c["maxSkew"] == 1 and c["whenUnsatisfiable"] == "ScheduleAnyway"
        pdb = one(docs, "PodDisruptionBudget", f"{FULL}-{component}")["spec"]
        assert pdb == {"minAvailable": 1, "selector": {"matchLabels": own}}
    # one worker: a PDB with minAvailable 1 would block every drain
    single = render(
        {**EXTERNAL, "worker": {"replicas": 1}, "web": {"topologySpreadConstraints": []}}
    )
    assert not [
        p for p in kinds(single, "PodDisruptionBudget") if p["metadata"]["name"].endswith("-worker")
    ]
    web = one(single, "Deployment", f"{FULL}-web")["spec"]["template"]["spec"]
    assert "topologySpreadConstraints" not in web


def test_probe_timings_are_values_and_the_handlers_stay() -> None:
    values = {
        **EXTERNAL,
        "web": {
            "probes": {
                "readiness": {"periodSeconds": 3, "timeoutSeconds": 2, "failureThreshold": 4},
                "liveness": {"periodSeconds": 40},
            }
        },
        "worker": {
            "probes": {"liveness": {"initialDelaySeconds": 120}, "readiness": {"periodSeconds": 9}}
        },
    }
    docs = render(values)
    [web] = one(docs, "Deployment", f"{FULL}-web")["spec"]["template"]["spec"]["containers"]
    assert web["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert {
        k: web["readinessProbe"][k] for k in ("periodSeconds", "timeoutSeconds", "failureThreshold")
    } == {
        "periodSeconds": 3,
        "timeoutSeconds": 2,
        "failureThreshold": 4,
    }
    assert web["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert web["livenessProbe"]["periodSeconds"] == 40
    [worker] = one(docs, "Deployment", f"{FULL}-worker")["spec"]["template"]["spec"]["containers"]
    assert worker["livenessProbe"]["initialDelaySeconds"] == 120
    assert worker["livenessProbe"]["exec"]["command"][-1] == "--live"
    assert worker["readinessProbe"]["periodSeconds"] == 9
    # the defaults are the timings the probes always had
    [web] = one(render(EXTERNAL), "Deployment", f"{FULL}-web")["spec"]["template"]["spec"][
        "containers"
    ]
    assert web["readinessProbe"]["periodSeconds"] == 10
    assert web["livenessProbe"]["failureThreshold"] == 6


def test_helm_test_asks_for_readiness() -> None:
    [pod] = [d for d in render(EXTERNAL) if d["metadata"]["name"] == f"{FULL}-test-healthz"]
    script = pod["spec"]["containers"][0]["command"][-1]
    assert f"{FULL}-web:8000/readyz" in script and "/healthz" not in script


def _secrets(values: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Render without the test cache: each call is a fresh `helm template`."""
    files = helm.Chart.load(CHART).render(values, name=RELEASE, namespace=NAMESPACE)
    docs = [
        d
        for path, text in files.items()
        if not path.endswith(".txt")
        for d in yaml.safe_load_all(text)
        if d
    ]
    return {
        d["metadata"]["name"]: {k: base64.b64decode(v).decode() for k, v in d["data"].items()}
        for d in docs
        if d["kind"] == "Secret"
    }


def test_a_seed_makes_generated_secrets_the_same_on_every_render() -> None:
    values = {**CASES["everything"], "secrets": {"seed": "s" * 40}}
    first, second = _secrets(values), _secrets(json.loads(json.dumps(values)))
    assert first == second
    app = first[f"{FULL}-app"]
    assert len(app["SECRET_KEY"]) == 64 and len(app["NODE_AGENT_TOKEN"]) == 64
    assert len({app["SECRET_KEY"], app["NODE_AGENT_TOKEN"], app["METRICS_TOKEN"]}) == 3
    pg = first[f"{FULL}-postgresql"]["password"]
    assert len(pg) == 32 and f":{pg}@" in app["DATABASE_URL"]
    assert f":{first[f'{FULL}-redis']['password']}@" in app["REDIS_URL"]
    # another seed, other values; explicit values win over the seed
    other = _secrets({**values, "secrets": {"seed": "t" * 40, "secretKey": "explicit"}})
    assert other[f"{FULL}-app"]["SECRET_KEY"] == "explicit"
    assert other[f"{FULL}-app"]["METRICS_TOKEN"] != app["METRICS_TOKEN"]
    # without a seed (or existingSecret) `helm template` generates anew: what the seed is for
    assert (
        _secrets(CASES["everything"])[f"{FULL}-app"]["SECRET_KEY"]
        != _secrets(CASES["everything"])[f"{FULL}-app"]["SECRET_KEY"]
    )


def test_the_notes_warn_about_generated_secrets_under_gitops() -> None:
    def notes(values: dict[str, Any]) -> str:
        return next(t for p, t in render_files(values).items() if p.endswith("NOTES.txt"))

    assert "set secrets.seed or secrets.existingSecret" in notes(EXTERNAL)
    assert "secrets.seed" not in notes({**EXTERNAL, "secrets": {"seed": "s" * 32}})
    assert "secrets.seed" not in notes(CASES["existing-secret"])
