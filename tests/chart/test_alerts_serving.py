"""The serving SLO and queue-age alerts, unit-tested with promtool on series
the real exporter (the portal's /metrics) and the test serving process produced.

The serving process (`portal.backends.serving_sim.Engine`, vLLM's names) runs on a simulated clock:
each promtool interval is one minute of its engine, then one scrape of it and of the
portal. Ten light minutes, then an overload: first tokens queue far past the inference
class's 500 ms objective, and the fast burn-rate alert fires.
"""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import time_machine
from django.test import Client
from django.utils import timezone

from portal.backends.serving_sim import STEP_S, Engine
from portal.models import Attempt
from portal.tick.run import run_tick
from tests.base import make_world, submit, submit_serving
from tests.chart.test_alerts import _promtool_on, _scrape


def _minute(engine: Engine, clock: list[float]) -> None:
    for _ in range(int(60 / STEP_S)):
        clock[0] += STEP_S
        engine.step(clock[0], STEP_S)


@pytest.mark.django_db
def test_the_ttft_slo_burn_rate_alert_fires_on_real_series(
    tmp_path: Path, client: Client, settings: Any
) -> None:
    """A vLLM and a Triton workload, both overloaded from minute 10."""
    settings.SIMULATED_SERVING_PROCESSES = False
    w = make_world()
    engines = []
    for runtime in ("vllm", "triton"):
        req = submit_serving(
            w.bob, w.vision, model_name="llama", model_revision="r1", runtime=runtime
        )
        labels = {
            "team": "vision",
            "workload": f"qm-{req.pk}",
            "pool": "h100-mig",
            "class": "inference",
            "model_name": "llama",
            "model_revision": "r1",
        }
        engines.append((req, Engine(runtime, labels, max_batch=16, rps=2.0, warmup_s=0.0, seed=3)))
    run_tick()
    assert Attempt.objects.filter(request__kind="serving").count() == 2
    clock = [time.monotonic()]
    scrapes = []
    for minute in range(31):
        if minute == 10:
            for _, engine in engines:
                engine.rps = 14.0  # twice what 16 sequences decode: the queue grows
        at, text = _scrape(client)
        for _, engine in engines:
            text += engine.metrics().decode()
        scrapes.append((at, text))
        start = clock[0]
        for _, engine in engines:
            clock[0] = start
            _minute(engine, clock)
    first = scrapes[0][1]
    assert 'quartermaster_serving_ttft_slo_le{class="inference",le="0.5"' in first
    assert 'quartermaster_serving_ttft_slo_le{class="inference",le="500.0"' in first
    fired = [
        {
            "exp_labels": {
                "severity": "critical",
                "team": "vision",
                "workload": f"qm-{r.pk}",
                "class": "inference",
            }
        }
        for r, _ in engines
    ]
    checks = [
        {
            "eval_time": "9m",
            "alertname": "QuartermasterServingTTFTBudgetBurnFast",
            "exp_alerts": [],
        },
        {
            "eval_time": "30m",
            "alertname": "QuartermasterServingTTFTBudgetBurnFast",
            "exp_alerts": fired,
        },
    ]
    result = _promtool_on(tmp_path, scrapes, "1m", checks)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.django_db
def test_the_queue_age_alert_fires_per_class_on_real_series(tmp_path: Path, client: Client) -> None:
    """An inference request (class limit 600 s) waits; nothing ticks."""
    w = make_world()
    start = timezone.now()
    scrapes = []
    with time_machine.travel(start, tick=False) as clock:
        submit(
            w.bob,
            w.vision,
            cls="inference",
            pool_name="h100-mig",
            profile_kind="mig",
            mig_profile="1g.10gb",
        )
        submit(w.bob, w.vision)  # training: no limit, never alerts
        for minute in range(21):
            clock.move_to(start + timedelta(minutes=minute))
            scrapes.append(_scrape(client))
    assert 'quartermaster_class_max_queue_seconds{class="inference"} 600.0' in scrapes[0][1]
    checks = [
        {"eval_time": "12m", "alertname": "QuartermasterQueueAgeOverClassLimit", "exp_alerts": []},
        {
            "eval_time": "20m",
            "alertname": "QuartermasterQueueAgeOverClassLimit",
            "exp_alerts": [{"exp_labels": {"severity": "warning", "class": "inference"}}],
        },
    ]
    result = _promtool_on(tmp_path, scrapes, "1m", checks)
    assert result.returncode == 0, result.stdout + result.stderr
