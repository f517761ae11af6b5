"""Render charts/quartermaster offline with helm-python-sdk (Helm 4 SDK via ctypes, no helm binary)."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

CHART = Path(__file__).resolve().parents[2] / "charts" / "quartermaster"
RELEASE = "qm"
NAMESPACE = "quartermaster"
#: kinds from CRDs: kubernetes-validate has no schema for them; checked by their own tests
CRD_KINDS = {"ServiceMonitor", "PrometheusRule", "PodMonitor"}

EXTERNAL = {
    "externalDatabase": {"url": "postgres://qm:pw@db.example.com:5432/quartermaster"},
    "externalRedis": {"url": "redis://:pw@redis.example.com:6379/0"},
}
#: a small site configuration file (portal/lib/config_schema.json) for the hook Job
SITE_CONFIG: dict[str, Any] = {
    "version": 1,
    "profiles": [{"name": "whole", "kind": "whole"}],
    "pools": [
        {
            "name": "a100",
            "gpu_model": "NVIDIA-A100-SXM4-80GB",
            "gpu_memory_mib": 81920,
            "node_selector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
        }
    ],
    "classes": [{"name": "training", "band": 100, "default_profile": "whole"}],
    "teams": [{"name": "team-a", "quotas": {"a100": {"nominal_milli": 8000}}}],
}
#: named value sets every chart test runs over: the defaults (plus the two required URLs) and
#: non-default ones that switch on every optional part
CASES: dict[str, dict[str, Any]] = {
    "defaults": EXTERNAL,
    "everything": {
        "postgresql": {"enabled": True},
        "redis": {"enabled": True},
        "teams": [
            {
                "name": "team-a",
                "quota": {
                    "requests.nvidia.com/gpu": "16",
                    "requests.nvidia.com/mig-3g.40gb": "4",
                    "requests.cpu": "256",
                    "requests.memory": "2Ti",
                    "count/jobs.batch": "500",
                },
                "readers": {"groups": ["team-a-researchers"], "users": ["alice@example.com"]},
            },
            {"name": "team-b", "namespace": "research-b", "quota": {"requests.nvidia.com/gpu": 4}},
            {"name": "team-c", "createNamespace": False},
        ],
        "ingress": {
            "enabled": True,
            "className": "nginx",
            "hosts": [{"host": "gpus.example.com"}],
            "tls": [{"secretName": "gpus-tls", "hosts": ["gpus.example.com"]}],
        },
        "metrics": {
            "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
            "podMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
            "prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
        },
        "nodeAgent": {"runtimeClassName": "nvidia", "priorityClassName": "system-node-critical"},
        "config": {
            "csrfTrustedOrigins": ["https://gpus.example.com"],
            "allowedHosts": ["gpus.example.com"],
            "workloads": {
                "runtimeClassName": "nvidia",
                "allowedImages": ["nvcr.io/"],
                "imagePullSecrets": ["regcred"],
            },
            "extraEnv": {"REQUEUE_LIMIT": "3"},
        },
        "imagePullSecrets": ["regcred"],
        "image": {"tag": "1.2.3"},
        "siteConfig": {"file": SITE_CONFIG, "prune": True},
    },
    "existing-secret": {
        "secrets": {"existingSecret": "qm-secrets"},
        "rbac": {"readPodsClusterWide": False},
        "teams": [{"name": "team-a"}],
        "admissionPolicy": {"enabled": False},
        "priorityClasses": {"create": False},
        "migrations": {"enabled": False},
        "web": {"replicas": 1},
        "siteConfig": {"existingConfigMap": "qm-site"},
    },
    "simulated": {
        **EXTERNAL,
        "config": {"clusterBackend": "simulated", "k8sInCluster": False},
        "nodeAgent": {"enabled": False},
        "metrics": {"dashboard": {"enabled": False}},
    },
    "sso": {
        **EXTERNAL,
        "config": {
            "sso": {
                "clientId": "quartermaster",
                "providerName": "Example SSO",
                "authorizationEndpoint": "https://sso.example.com/auth",
                "tokenEndpoint": "https://sso.example.com/token",
                "userinfoEndpoint": "https://sso.example.com/userinfo",
                "jwksEndpoint": "https://sso.example.com/jwks",
                "groupMap": [
                    {"group": "gpu-team-a", "team": "team-a", "role": "member"},
                    {"group": "gpu-leads-a", "team": "team-a", "role": "lead"},
                    {"group": "platform-admins", "team": "*", "role": "admin"},
                    {"group": "platform-auditors", "team": "*", "role": "auditor"},
                ],
                "passwordLogin": False,
            },
        },
        "secrets": {"oidcClientSecret": "client-secret"},
    },
}


@functools.cache
def _load() -> helm.Chart:
    return helm.Chart.load(CHART)


@functools.lru_cache(maxsize=32)
def _render(values_json: str) -> tuple[dict[str, str], tuple[dict[str, Any], ...]]:
    files = _load().render(json.loads(values_json), name=RELEASE, namespace=NAMESPACE)
    docs: list[dict[str, Any]] = []
    for path, text in sorted(files.items()):
        if path.endswith(".txt"):
            continue
        docs.extend(d for d in yaml.safe_load_all(text) if d)
    return files, tuple(docs)


def render(values: dict[str, Any]) -> list[dict[str, Any]]:
    return list(_render(json.dumps(values, sort_keys=True))[1])


def render_files(values: dict[str, Any]) -> dict[str, str]:
    return _render(json.dumps(values, sort_keys=True))[0]


def kinds(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    [doc] = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def pod_specs(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every pod template in the manifests, by "Kind/name"."""
    out = {}
    for d in docs:
        if d["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
            out[f"{d['kind']}/{d['metadata']['name']}"] = d["spec"]["template"]["spec"]
    return out
