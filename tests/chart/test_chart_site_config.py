"""The chart carries the site configuration: a hook Job applies `siteConfig` after install and upgrade."""

from __future__ import annotations

import yaml

from portal.lib.config import check
from tests.chart.chart import CASES, EXTERNAL, SITE_CONFIG, kinds, one, render

FULL = "qm-quartermaster"


def test_the_file_becomes_a_configmap_that_a_hook_job_applies() -> None:
    docs = render(CASES["everything"])
    cm = one(docs, "ConfigMap", f"{FULL}-site-config")
    assert yaml.safe_load(cm["data"]["config.yaml"]) == SITE_CONFIG
    assert check(SITE_CONFIG) == []
    job = one(docs, "Job", f"{FULL}-site-config")
    annotations = job["metadata"]["annotations"]
    assert annotations["helm.sh/hook"] == "post-install,post-upgrade"
    assert annotations["helm.sh/hook-delete-policy"] == "before-hook-creation"
    pod = job["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["command"] == [
        "python",
        "manage.py",
        "config",
        "apply",
        "-f",
        "/etc/quartermaster/site/config.yaml",
        "--prune",
    ]
    # it waits for the migrations, and has no Kubernetes API token
    assert [c["name"] for c in pod["initContainers"]] == ["wait-for-migrations"]
    assert pod["automountServiceAccountToken"] is False
    [volume] = [v for v in pod["volumes"] if v["name"] == "site-config"]
    assert volume["configMap"]["name"] == f"{FULL}-site-config"


def test_an_existing_configmap_is_mounted_instead() -> None:
    docs = render(CASES["existing-secret"])
    assert not [
        d for d in kinds(docs, "ConfigMap") if d["metadata"]["name"].endswith("site-config")
    ]
    job = one(docs, "Job", f"{FULL}-site-config")
    pod = job["spec"]["template"]["spec"]
    [volume] = [v for v in pod["volumes"] if v["name"] == "site-config"]
    assert volume["configMap"]["name"] == "qm-site"
    assert "--prune" not in pod["containers"][0]["command"]


def test_no_file_no_hook_job() -> None:
    docs = render(EXTERNAL)
    assert not [d for d in kinds(docs, "Job") if d["metadata"]["name"].endswith("site-config")]


def test_a_changed_file_changes_the_job_so_an_upgrade_applies_it() -> None:
    changed = {**SITE_CONFIG, "classes": [{"name": "training", "band": 150}]}
    a = one(render({**EXTERNAL, "siteConfig": {"file": SITE_CONFIG}}), "Job", f"{FULL}-site-config")
    b = one(render({**EXTERNAL, "siteConfig": {"file": changed}}), "Job", f"{FULL}-site-config")
    key = "checksum/site-config"
    assert a["metadata"]["annotations"][key] != b["metadata"]["annotations"][key]


def test_the_file_may_come_as_text_from_set_file() -> None:
    text = yaml.safe_dump(SITE_CONFIG)
    docs = render({**EXTERNAL, "siteConfig": {"file": text}})
    cm = one(docs, "ConfigMap", f"{FULL}-site-config")
    assert yaml.safe_load(cm["data"]["config.yaml"]) == SITE_CONFIG
