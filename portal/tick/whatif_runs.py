"""What-if runs: draft a policy change, replay it (a Celery task), apply it, audited."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from portal import access
from portal.lib import wake
from portal.models import PolicyProfile, Pool, Team, WhatIfRun, WorkloadClass
from portal.services.audit import audit
from portal.services.pools import pool_update, workload_class_update
from portal.services.profiles import policy_profile_update
from portal.services.teams import quota_set
from scheduling.whatif import SettingError, apply_settings

MAX_DAYS = 90
MAX_SETTINGS = 50


def _admin(actor: User) -> None:
    if not access.is_admin(actor):
        raise ValidationError({"__all__": "Only platform admins run and apply what-ifs."})


def parse_settings(text: str) -> dict[str, str]:
    """KEY=VALUE lines (blank lines and # comments skipped) as a form gives them."""
    out: dict[str, str] = {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            raise ValidationError({"settings": f"line {n}: expected KEY=VALUE"})
        out[key.strip()] = value.strip()
    if not out:
        raise ValidationError({"settings": "Propose at least one change."})
    if len(out) > MAX_SETTINGS:
        raise ValidationError({"settings": f"At most {MAX_SETTINGS} changes at a time."})
    return out


def whatif_draft(*, actor: User, days: int, settings: dict[str, str]) -> WhatIfRun:
    """Check the change against the site now and queue its replay."""
    from portal.tick import whatif

    _admin(actor)
    if not 1 <= days <= MAX_DAYS:
        raise ValidationError({"days": f"Between 1 and {MAX_DAYS} days."})
    try:
        apply_settings(whatif.site_now(), settings)
    except SettingError as exc:
        raise ValidationError({"settings": str(exc)}) from None
    with transaction.atomic():
        run = WhatIfRun.objects.create(created_by=actor, days=days, changes=settings)
        transaction.on_commit(lambda: _enqueue(run.pk))
    return run


def _enqueue(run_id: int) -> None:
    # By name, as portal/lib/wake.py wakes the tick: the task module imports this one. A
    # broker that refuses it is logged there, not raised: the run stays queued, not a 500.
    wake.enqueue(wake.WHATIF_TASK, run_id)


def whatif_execute(run_id: int, now: datetime | None = None) -> WhatIfRun:
    """Replay a queued run (the Celery task's body); progress is stored as it goes."""
    from portal.tick import whatif

    claimed = WhatIfRun.objects.filter(pk=run_id, state=WhatIfRun.State.QUEUED).update(
        state=WhatIfRun.State.RUNNING, progress=0
    )
    run = WhatIfRun.objects.get(pk=run_id)
    if not claimed:
        return run  # a redelivered task: the first one has it
    last = [0]

    def progress(done: int, total: int) -> None:
        pct = min(99, done * 100 // max(1, total))
        if pct >= last[0] + 2:
            last[0] = pct
            WhatIfRun.objects.filter(pk=run_id).update(progress=pct)

    try:
        result = whatif.run(days=run.days, settings=run.changes, now=now, progress=progress)
    except (SettingError, RuntimeError, ValueError) as exc:
        WhatIfRun.objects.filter(pk=run_id).update(
            state=WhatIfRun.State.FAILED, error=str(exc)[:500], finished_at=timezone.now()
        )
    else:
        WhatIfRun.objects.filter(pk=run_id).update(
            state=WhatIfRun.State.DONE, progress=100, result=result, finished_at=timezone.now()
        )
    run.refresh_from_db()
    return run


def whatif_apply(*, actor: User, run: WhatIfRun) -> WhatIfRun:
    """Make the replayed change real, each part through its own audited service, and audit
    the whole with the replay's result attached."""
    _admin(actor)
    with transaction.atomic():
        run = WhatIfRun.objects.select_for_update().get(pk=run.pk)
        if run.state != WhatIfRun.State.DONE:
            raise ValidationError({"__all__": "Only a finished replay can be applied."})
        if run.applied_at is not None:
            raise ValidationError({"__all__": "This change was applied already."})
        for key, value in run.changes.items():
            _apply_one(actor, key, value)
        run.applied_at, run.applied_by = timezone.now(), actor
        run.save(update_fields=["applied_at", "applied_by"])
        audit(
            actor=actor,
            action="whatif.apply",
            obj=run,
            before=None,
            after={"settings": run.changes, "days": run.days, "replay": run.result},
        )
    return run


def _gpus(key: str, value: str) -> int | None:
    if value.lower() in ("none", "unlimited"):
        return None
    try:
        return int(round(float(value) * 1000))
    except ValueError:
        raise ValidationError({"settings": f"{key}: expected a number of GPUs"}) from None


def _apply_one(actor: User, key: str, value: str) -> None:
    head, _, rest = key.partition(".")
    if head == "quota":
        team_name, pool_name, *parts = rest.split(".")
        team = Team.objects.get(name=team_name)
        pool = Pool.objects.get(name=pool_name)
        quota = team.quotas.filter(pool=pool).first()
        current: dict[str, Any] = {
            "nominal_milli": quota.nominal_milli if quota else 0,
            "borrowing_limit_milli": quota.borrowing_limit_milli if quota else None,
            "lending_limit_milli": quota.lending_limit_milli if quota else None,
        }
        field = {"nominal": "nominal_milli", "borrowing": "borrowing_limit_milli"}.get(
            (parts or ["nominal"])[0], "lending_limit_milli"
        )
        milli = _gpus(key, value)
        current[field] = 0 if milli is None and field == "nominal_milli" else milli
        quota_set(actor=actor, team=team, pool=pool, **current)
    elif head == "class":
        name, _, what = rest.partition(".")
        wc = WorkloadClass.objects.get(name=name)
        workload_class_update(
            actor=actor,
            workload_class=wc,
            **{what: value if what == "preemption" else int(value)},
        )
    elif head == "policy":
        active = PolicyProfile.objects.get(active=True)
        current_value = active.profile().knobs.get(rest)
        kind: Any = type(current_value)
        typed: Any = kind(value) if current_value is not None else value
        if isinstance(current_value, bool):
            typed = value.lower() in ("true", "1")
        policy_profile_update(actor=actor, profile=active, knobs={rest: typed})
    elif head == "pool" and rest.endswith(".inference_floor"):
        pool = Pool.objects.get(name=rest.rsplit(".", 1)[0])
        pool_update(actor=actor, pool=pool, inference_floor_milli=_gpus(key, value) or 0)
    else:
        raise ValidationError(
            {
                "settings": f"{key}: a replay only; nodes are added and removed on the cluster "
                "(or by the pool's autoscaling), not here"
            }
        )
