"""The chart's PrometheusRule checked and unit-tested with promtool.

promtool comes from the Debian package `prometheus` (`apt-get install -y
--no-install-recommends prometheus`) and is expected at /usr/bin/promtool. It
takes plain rule files, so the tests write the rendered PrometheusRule's `spec`
to rules.yaml first.

The queue, admission-wait, scheduler and node-agent alerts are tested on series
the real exporter produced from a real test database (the portal driven through
its services, ticks and node-agent endpoint, the clock moved between scrapes).
The rest (inference latency, skipped and failed ticks, DCGM and kube-state
series other exporters provide) keep hand-written series, checked to use the
names and labels the exporter exports, as the alerts and the dashboard are.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import time_machine
import yaml
from django.test import Client
from django.utils import timezone

from portal.metrics.collector import PortalCollector
from portal.models import WorkloadClass
from portal.tick.reconcile import reconcile
from portal.tick.run import run_tick
from tests.base import make_world, submit
from tests.chart.chart import CASES, CHART, one, render
from tests.chart.scrape import input_series, label_names

PROMTOOL = "/usr/bin/promtool"
HERE = Path(__file__).resolve().parent / "promtool"


def _rules(tmp_path: Path) -> Path:
    rule = one(render(CASES["everything"]), "PrometheusRule", "qm-quartermaster")
    spec = rule["spec"]
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    logic = {
        "groups": [
            {**g, "rules": [{k: v for k, v in r.items() if k != "annotations"} for r in g["rules"]]}
            for g in spec["groups"]
        ]
    }
    (tmp_path / "rules_logic.yaml").write_text(yaml.safe_dump(logic, sort_keys=False))
    for test in HERE.glob("*_test.yaml"):
        shutil.copy(test, tmp_path / test.name)
    return tmp_path


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_promtool_is_installed() -> None:
    assert Path(PROMTOOL).exists(), "apt-get install -y --no-install-recommends prometheus"


def test_the_rules_pass_promtool_check(tmp_path: Path) -> None:
    d = _rules(tmp_path)
    result = promtool("check", "rules", "rules.yaml", cwd=d)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_the_alerts_fire_when_they_should(tmp_path: Path) -> None:
    d = _rules(tmp_path)
    result = promtool("test", "rules", "alerts_test.yaml", "annotations_test.yaml", cwd=d)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_broken_expectation_fails(tmp_path: Path) -> None:
    """The harness itself can fail: an alert expected where none fires is reported."""
    d = _rules(tmp_path)
    text = (
        (d / "alerts_test.yaml")
        .read_text()
        .replace(
            "alertname: QuartermasterQueueStalled\n        exp_alerts: []",
            "alertname: QuartermasterQueueStalled\n        exp_alerts: [{exp_labels: {severity: warning}}]",
        )
    )
    (d / "broken_test.yaml").write_text(text)
    assert promtool("test", "rules", "broken_test.yaml", cwd=d).returncode != 0


# ---------------------------------------------------------------------------
# The rules on series the real exporter produced from a real test database.
# Each scenario drives the portal (services, ticks, node-agent reports) with the
# clock moved one promtool interval per step, scrapes /metrics after each step,
# and hands the scrapes to promtool as input series (tests/chart/scrape.py).

STEP = timedelta(minutes=5)


def _promtool_on(
    tmp_path: Path, scrapes: list[tuple[datetime, str]], interval: str, checks: list[Any]
) -> subprocess.CompletedProcess[str]:
    d = _rules(tmp_path)
    test = {
        "rule_files": ["rules_logic.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {"interval": interval, "input_series": input_series(scrapes), "alert_rule_test": checks}
        ],
    }
    (d / "real_test.yaml").write_text(yaml.safe_dump(test, sort_keys=False))
    return promtool("test", "rules", "real_test.yaml", cwd=d)


def _scrape(client: Client) -> tuple[datetime, str]:
    r = client.get("/metrics")
    assert r.status_code == 200
    return timezone.now(), r.content.decode()


@pytest.mark.django_db
@pytest.mark.slow
def test_a_stalled_queue_fires_on_real_series(
    tmp_path: Path, client: Client, settings: Any
) -> None:
    """vision fills the A100 pool and one more request waits: nothing is admitted."""
    settings.SIMULATED_SECONDS_PER_HOUR = 3600
    world = make_world()
    start = timezone.now()
    scrapes = []
    with time_machine.travel(start, tick=False) as clock:
        for _ in range(5):
            submit(world.bob, world.vision, count=8, estimated_runtime_s=100 * 3600)
        for step in range(7):  # 0..30 min
            clock.move_to(start + step * STEP)
            reconcile()
            run_tick()
            scrapes.append(_scrape(client))
    pending = [t for _, t in scrapes][-1]
    assert 'quartermaster_pending_requests{class="training",pool="a100-train"' in pending
    checks = [
        {"eval_time": "5m", "alertname": "QuartermasterQueueStalled", "exp_alerts": []},
        {
            "eval_time": "25m",
            "alertname": "QuartermasterQueueStalled",
            "exp_alerts": [{"exp_labels": {"severity": "warning"}}],
        },
    ]
    result = _promtool_on(tmp_path, scrapes, "5m", checks)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.django_db
def test_a_stopped_scheduler_fires_on_real_series(tmp_path: Path, client: Client) -> None:
    """Ticks run for five minutes, then stop: no tick for five minutes is critical."""
    make_world()
    start = timezone.now()
    scrapes = []
    with time_machine.travel(start, tick=False) as clock:
        for minute in range(16):
            clock.move_to(start + timedelta(minutes=minute))
            if minute <= 5:
                run_tick()
            scrapes.append(_scrape(client))
    checks = [
        {"eval_time": "4m", "alertname": "QuartermasterSchedulerNoLeader", "exp_alerts": []},
        {
            "eval_time": "15m",
            "alertname": "QuartermasterSchedulerNoLeader",
            "exp_alerts": [{"exp_labels": {"severity": "critical"}}],
        },
    ]
    result = _promtool_on(tmp_path, scrapes, "1m", checks)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.django_db
@pytest.mark.slow
def test_admissions_after_the_class_promise_fire_on_real_series(
    tmp_path: Path, client: Client, settings: Any
) -> None:
    """training promises 30 minutes here; vision fills the A100 pool with jobs that end from
    35 minutes on, and the requests queued behind them are admitted after the promise."""
    settings.SIMULATED_SECONDS_PER_HOUR = 3600
    world = make_world()
    WorkloadClass.objects.filter(name="training").update(max_queue_s=1800)
    start = timezone.now()
    scrapes = []
    with time_machine.travel(start, tick=False) as clock:
        for i in range(32):
            submit(world.bob, world.vision, estimated_runtime_s=(35 + i) * 60)
        for _ in range(16):
            submit(world.bob, world.vision, estimated_runtime_s=100 * 3600)
        for step in range(15):  # 0..70 min
            clock.move_to(start + step * STEP)
            reconcile()  # as beat does: endings free devices, then the tick admits
            run_tick()
            scrapes.append(_scrape(client))
    last = scrapes[-1][1]
    assert 'quartermaster_queue_promise_broken_total{class="training"}' in last
    assert 'quartermaster_queue_promise_attainment_ratio{class="training"}' in last
    assert 'quartermaster_queue_promise_broken_total{class="interactive"} 0.0' in last
    checks = [
        {"eval_time": "30m", "alertname": "QuartermasterAdmissionWaitHigh", "exp_alerts": []},
        {
            "eval_time": "70m",
            "alertname": "QuartermasterAdmissionWaitHigh",
            "exp_alerts": [{"exp_labels": {"severity": "warning", "class": "training"}}],
        },
    ]
    result = _promtool_on(tmp_path, scrapes, "5m", checks)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.django_db
@pytest.mark.slow
def test_the_same_waits_within_the_promise_do_not_fire(
    tmp_path: Path, client: Client, settings: Any
) -> None:
    """The same waits, but training promises two hours: no fixed number fires."""
    settings.SIMULATED_SECONDS_PER_HOUR = 3600
    world = make_world()
    WorkloadClass.objects.filter(name="training").update(max_queue_s=7200)
    start = timezone.now()
    scrapes = []
    with time_machine.travel(start, tick=False) as clock:
        for i in range(32):
            submit(world.bob, world.vision, estimated_runtime_s=(35 + i) * 60)
        for _ in range(16):
            submit(world.bob, world.vision, estimated_runtime_s=100 * 3600)
        for step in range(15):
            clock.move_to(start + step * STEP)
            reconcile()
            run_tick()
            scrapes.append(_scrape(client))
    assert 'quartermaster_queue_promise_attainment_ratio{class="training"} 1.0' in scrapes[-1][1]
    checks = [{"eval_time": "70m", "alertname": "QuartermasterAdmissionWaitHigh", "exp_alerts": []}]
    result = _promtool_on(tmp_path, scrapes, "5m", checks)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.django_db
def test_a_silent_node_agent_fires_on_real_heartbeats(
    tmp_path: Path, client: Client, settings: Any
) -> None:
    settings.NODE_AGENT_TOKEN = "agent-token"
    make_world()
    agent = Client(HTTP_AUTHORIZATION="Bearer agent-token")
    start = timezone.now()
    scrapes = []
    with time_machine.travel(start, tick=False) as clock:
        for minute in range(11):
            clock.move_to(start + timedelta(minutes=minute))
            # a100-01 reports once and falls silent; a100-02 keeps reporting
            for node in ["a100-02"] + (["a100-01"] if minute == 0 else []):
                report = {"node": node, "sent_at": timezone.now().isoformat(), "devices": []}
                r = agent.post("/api/v1/agent/report/", report, content_type="application/json")
                assert r.status_code == 202
            scrapes.append(_scrape(client))
    checks = [
        {"eval_time": "4m", "alertname": "QuartermasterNodeAgentStale", "exp_alerts": []},
        {
            "eval_time": "10m",
            "alertname": "QuartermasterNodeAgentStale",
            "exp_alerts": [{"exp_labels": {"severity": "warning", "node": "a100-01"}}],
        },
    ]
    result = _promtool_on(tmp_path, scrapes, "1m", checks)
    assert result.returncode == 0, result.stdout + result.stderr


# ---------------------------------------------------------------------------
# Exporter, alerts and dashboard agree on names and labels.

#: series other exporters provide (DCGM, kube-state-metrics); labels Prometheus adds
EXTERNAL = ("DCGM_", "kube_")
TARGET_LABELS = {"instance", "job", "pod", "namespace", "service", "endpoint", "le"}
_SELECTOR = re.compile(r"\b(quartermaster_[a-z_]+)\s*(\{[^}]*\})?")
_BY = re.compile(r"\bby\s*\(([^)]*)\)")
_MATCHER = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)")


def _family(name: str) -> str:
    for suffix in ("_bucket", "_count", "_sum", "_total"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def _exported(client: Client) -> dict[str, set[str]]:
    """Label names per family: those of the scrape's samples, and those each family declares
    (a family with no samples yet, such as time to first token, shows no labels in a scrape)."""
    world = make_world()
    submit(world.bob, world.vision)
    run_tick()
    names = label_names(client.get("/metrics").content.decode())
    for family in PortalCollector().collect():
        names.setdefault(family.name, set()).update(getattr(family, "_labelnames", ()))
    return names


def _check_expr(expr: str, exported: dict[str, set[str]], where: str) -> list[str]:
    problems = []
    names = [m.group(1) for m in _SELECTOR.finditer(expr)]
    labels_of_expr: set[str] = set()
    for name in names:
        family = _family(name)
        if family not in exported:
            problems.append(f"{where}: {name} is not exported")
            continue
        labels_of_expr |= exported[family]
    for m in _SELECTOR.finditer(expr):
        family = _family(m.group(1))
        for label, _ in _MATCHER.findall(m.group(2) or ""):
            if label not in exported.get(family, set()) | TARGET_LABELS:
                problems.append(f"{where}: {m.group(1)} has no label {label}")
    if names:
        for group in _BY.findall(expr):
            for label in (x.strip() for x in group.split(",")):
                if label and label not in labels_of_expr | TARGET_LABELS:
                    problems.append(f"{where}: by ({label}) is not a label of {names}")
    return problems


@pytest.mark.django_db
def test_the_alerts_and_the_dashboard_use_what_the_exporter_exports(client: Client) -> None:
    exported = _exported(client)
    problems = []
    rule = one(render(CASES["everything"]), "PrometheusRule", "qm-quartermaster")
    for group in rule["spec"]["groups"]:
        for r in group["rules"]:
            problems += _check_expr(r["expr"], exported, r["alert"])
    dashboard = json.loads((CHART / "files" / "dashboard.json").read_text())
    exprs = []

    def walk(panels: list[dict[str, Any]]) -> None:
        for p in panels:
            exprs.extend((p.get("title", ""), t["expr"]) for t in p.get("targets", []))
            walk(p.get("panels", []))

    walk(dashboard["panels"])
    exprs += [
        (v["name"], v["definition"]) for v in dashboard["templating"]["list"] if "definition" in v
    ]
    assert exprs
    for title, expr in exprs:
        problems += _check_expr(expr.replace("$__rate_interval", "5m"), exported, title)
    assert not problems, "\n".join(problems)


@pytest.mark.django_db
def test_the_hand_written_promtool_series_use_exported_labels(client: Client) -> None:
    """The few rules tested on written series (inference, skipped ticks, DCGM) still name
    series and labels as the exporter does."""
    exported = _exported(client)
    problems = []
    for path in HERE.glob("*_test.yaml"):
        for test in yaml.safe_load(path.read_text())["tests"]:
            for s in test["input_series"]:
                name = s["series"].split("{")[0]
                if name.startswith(EXTERNAL):
                    continue
                problems += _check_expr(s["series"], exported, path.name)
    assert not problems, "\n".join(problems)
