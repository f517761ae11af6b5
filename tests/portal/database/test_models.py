from __future__ import annotations

import pytest
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from portal.models import (
    Allocation,
    Attempt,
    AuditEvent,
    Decision,
    Device,
    GpuRequest,
    UsageRecord,
)
from tests.base import make_world, submit

pytestmark = pytest.mark.django_db


def _attempt(req: GpuRequest, number: int = 1, state: str = "admitted") -> Attempt:
    return Attempt.objects.create(
        request=req,
        number=number,
        state=state,
        pool=req.pool,
        nodes=["a100-01"],
        workload_name=f"qm-{req.pk}-{number}",
        namespace=req.team.namespace,
        gpus_milli=1000,
        admitted_at=timezone.now(),
    )


def test_it_forbids_two_active_allocations_of_one_slot() -> None:
    w = make_world()
    device = Device.objects.get(node__name="a100-01", index=0)
    first = _attempt(submit(w.bob, w.vision))
    second = _attempt(submit(w.bob, w.vision))
    Allocation.objects.create(attempt=first, device=device, slot="gpu")
    with pytest.raises(IntegrityError), transaction.atomic():
        Allocation.objects.create(attempt=second, device=device, slot="gpu")


def test_it_allows_a_slot_again_once_the_old_allocation_is_inactive() -> None:
    w = make_world()
    device = Device.objects.get(node__name="a100-01", index=0)
    first = _attempt(submit(w.bob, w.vision))
    Allocation.objects.create(attempt=first, device=device, slot="gpu", active=False)
    second = _attempt(submit(w.bob, w.vision))
    Allocation.objects.create(attempt=second, device=device, slot="gpu")
    assert Allocation.objects.filter(device=device, active=True).count() == 1


def test_it_allows_one_active_attempt_per_request() -> None:
    w = make_world()
    req = submit(w.bob, w.vision)
    _attempt(req, 1)
    with pytest.raises(IntegrityError), transaction.atomic():
        _attempt(req, 2)


def test_it_keeps_audit_events_append_only_in_python() -> None:
    w = make_world()
    submit(w.bob, w.vision)
    event = AuditEvent.objects.filter(action="request.submit").get()
    event.action = "tampered"
    with pytest.raises(PermissionError):
        event.save()
    with pytest.raises(PermissionError):
        event.delete()
    with pytest.raises(PermissionError):
        AuditEvent.objects.filter(pk=event.pk).update(action="tampered")
    with pytest.raises(PermissionError):
        AuditEvent.objects.all().delete()


def test_it_keeps_audit_events_append_only_in_the_database() -> None:
    w = make_world()
    submit(w.bob, w.vision)
    event = AuditEvent.objects.filter(action="request.submit").get()
    table = AuditEvent._meta.db_table
    statements = [f"UPDATE {table} SET action = 'x' WHERE id = %s"]
    if connection.vendor == "postgresql":
        statements.append(f"DELETE FROM {table} WHERE id = %s")
    for sql in statements:
        with (
            pytest.raises(Exception, match="append-only"),
            transaction.atomic(),
            connection.cursor() as cur,
        ):
            cur.execute(sql, [event.pk])
    assert AuditEvent.objects.get(pk=event.pk).action == "request.submit"


def test_it_cascades_the_decision_log_through_the_orm() -> None:
    # The log's foreign keys are not database constraints: deletes must still reach it.
    w = make_world()
    kept, gone = submit(w.bob, w.vision), submit(w.bob, w.vision)
    attempt = _attempt(kept)
    Decision.objects.create(request=kept, attempt=attempt, team=w.vision, kind="admit", code="a")
    Decision.objects.create(request=gone, team=w.vision, kind="wait", code="w")
    gone.delete()
    attempt.delete()
    assert list(Decision.objects.values_list("request_id", "attempt_id")) == [(kept.pk, None)]


def test_it_cascades_an_attempts_allocations_and_usage_through_the_orm() -> None:
    # Their foreign keys to the attempt are not database constraints either.
    w = make_world()
    kept, gone = _attempt(submit(w.bob, w.vision)), _attempt(submit(w.bob, w.vision))
    for attempt, index in ((kept, 0), (gone, 1)):
        device = Device.objects.get(node__name="a100-01", index=index)
        Allocation.objects.create(attempt=attempt, device=device, slot="gpu")
        UsageRecord.objects.create(
            attempt=attempt,
            team=w.vision,
            workload_class=attempt.request.workload_class,
            pool=attempt.pool,
            gpus_milli=1000,
            started_at=timezone.now(),
        )
    gone.delete()
    assert list(Allocation.objects.values_list("attempt_id", flat=True)) == [kept.pk]
    assert list(UsageRecord.objects.values_list("attempt_id", flat=True)) == [kept.pk]
