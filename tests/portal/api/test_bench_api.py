"""`bench_web --api`'s profile of a submit: where the time goes, and how many statements."""

from __future__ import annotations

import pytest

from portal.management.commands.bench_web import _profile_submits
from portal.models import GpuRequest
from tests.base import api_secret, make_world

pytestmark = pytest.mark.django_db


def test_the_profile_counts_a_submits_statements_and_names_where_its_time_goes() -> None:
    w = make_world()
    secret = api_secret(w.bob)
    out = _profile_submits([(secret, "vision")], 3)
    assert GpuRequest.objects.count() == 5 + 1 + 3  # warm-up, counted, profiled
    assert out["submits"] == 3
    assert 5 <= out["queries_per_submit"] <= 30
    assert any("INSERT INTO" in q for q in out["queries"])
    fns = [r["fn"] for r in out["portal_cumulative_ms_per_submit"]]
    assert any("gpu_request_submit" in f for f in fns)
    assert out["own_time_ms_per_submit"] and all(
        r["ms"] >= 0 for r in out["own_time_ms_per_submit"]
    )
