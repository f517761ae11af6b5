"""Schemathesis over the whole API: every operation of /api/schema/, called as a member and
as an admin with generated data (valid and not), answers without a server error and as the
schema says (status codes, content types, bodies).

Bounded by QM_FUZZ_EXAMPLES examples per operation (default 25) so
that it fits in a few minutes. The database is the test world's, rolled back at the end.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from django.test import Client
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from portal.tick import run as tick
from tests.base import api_secret, make_world, submit

pytestmark = [pytest.mark.django_db, pytest.mark.fuzz]

EXAMPLES = int(os.environ.get("QM_FUZZ_EXAMPLES", "25"))
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


def test_the_api_keeps_its_schema(settings: Any) -> None:
    # Throttles would answer 429 (documented) to most of the run and hide the rest.
    settings.REST_FRAMEWORK = {
        **settings.REST_FRAMEWORK,
        "DEFAULT_THROTTLE_RATES": {"anon": None, "user": None, "token": None},
    }
    world = make_world()
    for _ in range(3):
        submit(world.bob, world.vision)
    tick.run_tick()
    tokens = {
        "member": api_secret(world.bob),
        "admin": api_secret(world.dave),
    }
    raw = Client(HTTP_AUTHORIZATION=f"Token {tokens['admin']}").get(
        "/api/schema/", {"format": "json"}
    )
    assert raw.status_code == 200
    schema = schemathesis.openapi.from_dict(raw.json())
    schema.app = get_wsgi_application()
    # The request cycle must not close the test's database connection (as django.test.Client).
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    failures: dict[str, str] = {}
    operations = []
    try:
        for result in schema.get_all_operations():
            operation = result.ok()
            operations.append(operation.label)
            try:
                _fuzz(operation, tokens)
            except Exception as exc:  # every operation is tried; all failures are reported
                failures[operation.label] = f"{type(exc).__name__}: {exc}"[:2000]
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)
    assert len(operations) >= 13, operations
    assert not failures, "\n\n".join(f"{k}\n{v}" for k, v in failures.items())


def _fuzz(operation: Any, tokens: dict[str, str]) -> None:
    @given(case=operation.as_strategy())
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    def run(case: Any) -> None:
        for role in ("member", "admin"):
            case.call_and_validate(
                headers={"Authorization": f"Token {tokens[role]}"}, checks=CHECKS
            )

    run()
