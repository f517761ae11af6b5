"""The chart's PrometheusRule checked and unit-tested with promtool.

promtool comes from the Debian package `prometheus` (`apt-get install -y
--no-install-recommends prometheus`) and is expected at /usr/bin/promtool. It
takes plain rule files, so the tests write the rendered PrometheusRule's `spec`
to rules.yaml first.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml

from tests.k8s.chart import CASES, one, render

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
