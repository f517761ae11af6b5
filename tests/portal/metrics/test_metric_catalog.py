"""docs/metrics.md is generated from code and CI fails when it is stale."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command

from portal.metrics import catalog as metric_catalog

pytestmark = pytest.mark.django_db


def test_docs_metrics_md_is_current() -> None:
    assert metric_catalog.DOC.read_text() == metric_catalog.render(), (
        "docs/metrics.md is stale: run python manage.py metrics_catalog"
    )


def test_it_lists_series_labels_and_the_alerts_using_them() -> None:
    text = metric_catalog.render()
    assert "| `quartermaster_serving_ttft_slo_le` | gauge | team, workload, class, le |" in text
    row = next(x for x in text.splitlines() if x.startswith("| vllm | `vllm:time_to_first"))
    assert (
        "QuartermasterServingTTFTBudgetBurnFast" in row
        and "QuartermasterInferenceLatencyHigh" in row
    )
    row = next(x for x in text.splitlines() if "`quartermaster_queue_oldest_age_seconds`" in x)
    assert "QuartermasterQueueAgeOverClassLimit" in row
    for name in ("ttft_p95_seconds", "batch_size", "queue_depth", "gpu_utilization"):
        assert f"| `{name}` |" in text


def test_the_check_fails_on_a_stale_file(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    stale = tmp_path / "metrics.md"
    stale.write_text("# Metrics\n")
    monkeypatch.setattr(metric_catalog, "DOC", stale)
    with pytest.raises(CommandError, match="stale"):
        call_command("metrics_catalog", "--check")
    call_command("metrics_catalog")
    call_command("metrics_catalog", "--check")
