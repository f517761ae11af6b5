"""Helpers for the `cluster` tests: a running control plane (scripts/controlplane) and what the
tests do to it as an administrator would (server-side apply, tokens, waiting)."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml
from kubernetes import client, config, dynamic
from kubernetes.client.exceptions import ApiException

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "controlplane"
FIELD_MANAGER = "quartermaster-tests"

T = TypeVar("T")


def wait_for(what: str, probe: Callable[[], T | None], timeout_s: float = 30.0) -> T:
    """Poll `probe` until it returns something truthy; fail naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while True:
        try:
            last = probe()
        except ApiException as exc:  # a transient answer while the cluster settles
            last = exc
            if exc.status not in (404, 409, 429, 500, 503):
                raise
        if last and not isinstance(last, ApiException):
            return last
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout_s:.0f}s waiting for {what}; last: {last!r}"
            )
        time.sleep(0.2)


@dataclass
class Cluster:
    """A control plane started by `scripts/controlplane up STATE`."""

    state: Path
    env: dict[str, str] = field(default_factory=dict)

    @property
    def kubeconfig(self) -> str:
        return self.env["KUBECONFIG"]

    @property
    def etcd_url(self) -> str:
        return self.env["QM_ETCD_URL"]

    def api(self) -> client.ApiClient:
        """An admin client (system:masters), as the person installing the chart."""
        return config.new_client_from_config(config_file=self.kubeconfig)  # type: ignore[no-untyped-call]

    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api())

    def batch(self) -> client.BatchV1Api:
        return client.BatchV1Api(self.api())

    def dynamic(self) -> dynamic.DynamicClient:
        return dynamic.DynamicClient(self.api())

    def script(self, *args: str, timeout: float = 180) -> None:
        subprocess.run([str(SCRIPT), *args, str(self.state)], check=True, timeout=timeout)

    # -- apply ---------------------------------------------------------------------------

    def apply(
        self, docs: Iterable[dict[str, Any]], *, dry_run: bool = False, api: Any = None
    ) -> list[dict[str, Any]]:
        """Server-side apply each document with strict field validation (unknown or duplicate
        fields are errors, as `kubectl apply --server-side --validate=strict`)."""
        dyn = dynamic.DynamicClient(api or self.api())
        out = []
        for doc in docs:
            out.append(apply_one(dyn, doc, dry_run=dry_run))
        return out

    # -- etcd ------------------------------------------------------------------------------

    def etcd_compact(self) -> int:
        """Compact etcd up to its current revision (the gRPC gateway of the client URL)."""

        def post(path: str, body: dict[str, Any]) -> dict[str, Any]:
            req = urllib.request.Request(
                self.etcd_url + path,
                data=json.dumps(body).encode(),
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(req, timeout=10) as r:
                return dict(json.load(r))

        rev = int(post("/v3/kv/range", {"key": "AA=="})["header"]["revision"])
        post("/v3/kv/compaction", {"revision": rev, "physical": True})
        return rev


def apply_one(dyn: dynamic.DynamicClient, doc: dict[str, Any], *, dry_run: bool = False) -> Any:
    res = dyn.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
    meta = doc["metadata"]
    ns = meta.get("namespace") if res.namespaced else None
    if res.namespaced and not ns:
        ns = "default"
        doc = {**doc, "metadata": {**meta, "namespace": ns}}
    path = res.path(name=meta["name"], namespace=ns)
    query = [("fieldValidation", "Strict")]
    return dyn.request(
        "PATCH",
        path,
        body=yaml.safe_dump(doc),
        content_type="application/apply-patch+yaml",
        field_manager=FIELD_MANAGER,
        force_conflicts=True,
        query_params=query,
        **({"dry_run": "All"} if dry_run else {}),
    )


def token_client(cluster: Cluster, namespace: str, service_account: str) -> client.ApiClient:
    """An ApiClient that authenticates with a bound token of the ServiceAccount (TokenRequest),
    exactly what a pod running as that ServiceAccount presents."""
    admin = cluster.core()
    tr = admin.create_namespaced_service_account_token(
        service_account,
        namespace,
        client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600)
        ),
    )
    base = cluster.api().configuration
    cfg = client.Configuration()
    cfg.host = base.host
    cfg.ssl_ca_cert = base.ssl_ca_cert
    cfg.verify_ssl = True
    cfg.api_key = {"authorization": tr.status.token}
    cfg.api_key_prefix = {"authorization": "Bearer"}
    return client.ApiClient(cfg)


def token_kubeconfig(cluster: Cluster, api: client.ApiClient, path: Path) -> Path:
    """A kubeconfig file for `api`'s token (what `from_settings` loads with KUBECONFIG)."""
    cfg = api.configuration
    token = cfg.api_key["authorization"]
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "c", "cluster": {"server": cfg.host, "certificate-authority": cfg.ssl_ca_cert}}
        ],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "c", "user": "sa"}}],
        "current-context": "sa",
    }
    path.write_text(yaml.safe_dump(doc))
    os.chmod(path, 0o600)
    return path


def can_i(
    api: client.ApiClient, verb: str, resource: str, namespace: str = "", group: str = ""
) -> bool:
    review = client.AuthorizationV1Api(api).create_self_subject_access_review(
        client.V1SelfSubjectAccessReview(
            spec=client.V1SelfSubjectAccessReviewSpec(
                resource_attributes=client.V1ResourceAttributes(
                    verb=verb, resource=resource, namespace=namespace or None, group=group
                )
            )
        )
    )
    return bool(review.status.allowed)


def merge_patch_node(core: client.CoreV1Api, name: str, body: dict[str, Any]) -> Any:
    """A JSON merge patch (the client would otherwise send a dict as a JSON patch)."""
    return core.patch_node(name, body, _content_type="application/merge-patch+json")


def node_ready(node: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (node.status.conditions or ()))


def node_settled(node: Any) -> bool:
    """Ready, and the node controller has lifted its `node.kubernetes.io/*` taints: on a busy
    machine the not-ready taint outlives the Ready condition for a moment, and the portal
    rightly packs nothing on a tainted node."""
    return node_ready(node) and not any(
        t.key.startswith("node.kubernetes.io/") for t in (node.spec.taints or ())
    )
