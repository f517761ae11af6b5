"""The site as code: the configuration file read from the database, and applied to it.

`config_document` writes what `manage.py config export` prints; `config_apply` makes the
database match a parsed file (`portal.lib.config.parse`) through the same services the pages
and the API use, so every change is one audit event. It runs in one transaction: any error
rolls all of it back, and a dry run rolls back what it did to report the same diff.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Field

from portal.lib.config import ConfigError
from portal.models import DeviceProfile, PolicyProfile, Pool, Team, WorkloadClass
from portal.services.pools import (
    device_profile_set,
    pool_create,
    pool_retire,
    pool_update,
    workload_class_create,
    workload_class_retire,
    workload_class_update,
)
from portal.services.profiles import (
    policy_profile_activate,
    policy_profile_create,
    policy_profile_update,
)
from portal.services.teams import quota_set, team_create, team_retire, team_update
from scheduling import profile as scheduling_profile

#: a pool's settings as the file says them, in the model's words
POOL_KEYS = [
    "gpu_model",
    "gpu_memory_mib",
    "architecture",
    "interconnect",
    "partitioning",
    "time_slicing_replicas",
    "sharing_engine",
    "mig_layout",
    "node_selector",
    "taints",
    "lifecycle",
    "inference_floor_milli",
    "burn_in_new_nodes",
]
AUTOSCALE_KEYS = [
    "min_nodes",
    "max_nodes",
    "idle_release_s",
    "node_gpus",
    "node_cpu_milli",
    "node_memory_mib",
]
#: set when a pool is made; changing them would misdescribe its nodes, so a new pool is needed
POOL_FIXED = ("gpu_model", "gpu_memory_mib", "partitioning")
CLASS_KEYS = [
    "description",
    "band",
    "preemption",
    "min_runtime_s",
    "max_queue_s",
    "latency_objective_ms",
    "default_profile",
    "inference",
    "priority_class_name",
    "restricted",
    "teams",
    "kinds",
    "pools",
]
#: the class keys that name other rows (set apart from the class's own fields)
CLASS_LINKS = ("teams", "pools")
TEAM_KEYS = ["display_name", "namespace", "weight", "max_pending", "groups"]
QUOTA_KEYS = ["nominal_milli", "borrowing_limit_milli", "lending_limit_milli", "granted_milli"]
PROFILE_KEYS = ["kind", "mig_profile", "milli", "gpu_memory_mib"]


@dataclass
class Change:
    """One line of the diff: an object created, changed field by field, or retired."""

    kind: str
    name: str
    action: str  # "created" | "changed" | "retired" | "not in the file"
    fields: dict[str, tuple[Any, Any]] = field(default_factory=dict)

    def lines(self) -> list[str]:
        head = f"{self.action} {self.kind} {self.name}"
        return [head] + [f"    {k}: {old!r} -> {new!r}" for k, (old, new) in self.fields.items()]


# --- the database as the file says it ---------------------------------------------------


def pool_as_file(p: Pool) -> dict[str, Any]:
    out: dict[str, Any] = {"name": p.name}
    for key in POOL_KEYS:
        out["replicas" if key == "time_slicing_replicas" else key] = getattr(p, key)
    if p.autoscaled:
        out["autoscale"] = {k: getattr(p, k) for k in AUTOSCALE_KEYS}
    return out


def class_as_file(wc: WorkloadClass) -> dict[str, Any]:
    out: dict[str, Any] = {"name": wc.name}
    for key in CLASS_KEYS:
        if key == "teams":
            # a retired team is no longer offered a class: the file names the live ones
            out[key] = sorted(wc.teams.filter(retired_at=None).values_list("name", flat=True))
        elif key == "pools":
            # a retired pool takes no work: the file names the live ones it could apply
            out[key] = sorted(wc.pools.filter(retired_at=None).values_list("name", flat=True))
        elif key == "default_profile":
            out[key] = wc.default_profile.name if wc.default_profile else None
        else:
            out[key] = getattr(wc, key)
    return out


def team_as_file(t: Team) -> dict[str, Any]:
    out: dict[str, Any] = {"name": t.name, **{k: getattr(t, k) for k in TEAM_KEYS}}
    out["quotas"] = {
        q.pool.name: {k: getattr(q, k) for k in QUOTA_KEYS}
        for q in t.quotas.select_related("pool")
        .filter(pool__retired_at=None)
        .order_by("pool__name")
    }
    return out


def config_document() -> dict[str, Any]:
    """The site's policy as one configuration file (what `config export` writes)."""
    doc: dict[str, Any] = {"version": 1}
    active = PolicyProfile.objects.filter(active=True).first()
    if active is not None:
        doc["scheduling_profile"] = {"name": active.name, "knobs": dict(active.profile().knobs)}
    doc["profiles"] = [
        {"name": d.name, **{k: getattr(d, k) for k in PROFILE_KEYS}}
        for d in DeviceProfile.objects.order_by("name")
    ]
    doc["pools"] = [pool_as_file(p) for p in Pool.objects.filter(retired_at=None).order_by("name")]
    doc["classes"] = [
        class_as_file(c)
        for c in WorkloadClass.objects.filter(retired_at=None)
        .select_related("default_profile")
        .order_by("name")
    ]
    doc["teams"] = [team_as_file(t) for t in Team.objects.filter(retired_at=None).order_by("name")]
    return doc


# --- the file as the database should be ------------------------------------------------


def _pool_wanted(entry: dict[str, Any]) -> dict[str, Any]:
    defaults: dict[str, Any] = {
        "architecture": "",
        "interconnect": "pcie",
        "partitioning": "exclusive",
        "replicas": 1,
        "mig_layout": [],
        "node_selector": {},
        "taints": [],
        "lifecycle": "production",
        "inference_floor_milli": 0,
        "burn_in_new_nodes": True,
    }
    out = {
        "name": entry["name"],
        **defaults,
        **{k: v for k, v in entry.items() if k != "autoscale"},
    }
    out.pop("labels", None)
    nodes = out.pop("nodes", None) or {}
    auto = entry.get("autoscale")
    if auto:
        # the simulated cluster's node spec is the shape an autoscaled pool adds
        shape = {
            "node_gpus": "gpus",
            "node_cpu_milli": "cpu_milli",
            "node_memory_mib": "memory_mib",
        }
        model = {k: _default(Pool, k) for k in AUTOSCALE_KEYS}
        out["autoscale"] = {
            k: auto.get(k, nodes.get(shape.get(k, ""), model[k])) for k in AUTOSCALE_KEYS
        }
    return out


def _default(model: type[Pool] | type[WorkloadClass], name: str) -> Any:
    f = model._meta.get_field(name)
    assert isinstance(f, Field)
    return f.get_default()


def pool_fields_from_file(entry: dict[str, Any]) -> dict[str, Any]:
    """A config-file pool entry as `pool_create`'s fields (defaults filled in)."""
    wanted = _pool_wanted(entry)
    fields = {("time_slicing_replicas" if k == "replicas" else k): v for k, v in wanted.items()}
    auto = fields.pop("autoscale", None)
    fields.update(auto or {})
    fields["autoscaled"] = bool(auto)
    return fields


def _class_wanted(entry: dict[str, Any]) -> dict[str, Any]:
    model = {
        k: _default(WorkloadClass, k)
        for k in CLASS_KEYS
        if k not in (*CLASS_LINKS, "default_profile")
    }
    out = {"name": entry["name"], **model, "default_profile": None, "teams": [], "pools": []}
    out.update(entry)
    out["teams"] = sorted(out["teams"])
    out["pools"] = sorted(out["pools"])
    return out


def _team_wanted(entry: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": entry["name"],
        "display_name": entry["name"],
        "namespace": f"qm-{entry['name']}",
        "weight": 1,
        "max_pending": 0,
        "groups": {},
    }
    out.update(entry)
    out["quotas"] = {
        pool: {
            "nominal_milli": q.get("nominal_milli", 0),
            "borrowing_limit_milli": q.get("borrowing_limit_milli"),
            "lending_limit_milli": q.get("lending_limit_milli"),
            "granted_milli": q.get("granted_milli", 0),
        }
        for pool, q in entry.get("quotas", {}).items()
    }
    return out


def _diff(old: dict[str, Any], new: dict[str, Any], keys: list[str]) -> dict[str, tuple[Any, Any]]:
    return {k: (old.get(k), new.get(k)) for k in keys if old.get(k) != new.get(k)}


def _mark(row: Pool | Team | WorkloadClass) -> None:
    """Managed by the file from now on: the pages say so, and a change there is drift."""
    if not row.config_managed:
        type(row)._default_manager.filter(pk=row.pk).update(config_managed=True)


# --- apply ---------------------------------------------------------------------------


class _Run:
    """One apply: the changes made so far and the errors met, each at its path."""

    def __init__(self, prune: bool) -> None:
        self.prune = prune
        self.changes: list[Change] = []
        self.errors: list[str] = []

    def attempt(self, path: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ValidationError as exc:
            for key, messages in exc.message_dict.items():
                where = path if key == "__all__" else f"{path}.{key}"
                self.errors.extend(f"{where}: {m}" for m in messages)
            return None


def config_apply(
    *, doc: dict[str, Any], dry_run: bool = False, prune: bool = False
) -> list[Change]:
    """Make the database match `doc`: every change one audit event (the system acting), all in
    one transaction. Sections the file leaves out are left alone; with `prune`, pools and
    classes and teams the file no longer lists are retired and quotas it no longer lists are
    zeroed.
    Raises ConfigError with every error at its path, having changed nothing."""
    run = _Run(prune)
    with transaction.atomic():
        if "profiles" in doc:
            _apply_profiles(run, doc["profiles"])
        if "pools" in doc:
            _apply_pools(run, doc["pools"])
        if "teams" in doc:
            _apply_teams(run, doc["teams"])
        if "classes" in doc:
            _apply_classes(run, doc["classes"])
        if "teams" in doc:
            _apply_quotas(run, doc["teams"])
        if "scheduling_profile" in doc:
            _apply_scheduling_profile(run, doc["scheduling_profile"])
        if run.errors or dry_run:
            transaction.set_rollback(True)
    if run.errors:
        raise ConfigError(run.errors)
    return run.changes


def _apply_profiles(run: _Run, entries: list[dict[str, Any]]) -> None:
    current = {d.name: d for d in DeviceProfile.objects.all()}
    for i, entry in enumerate(entries):
        wanted = {"kind": entry["kind"], "mig_profile": "", "milli": 1000, "gpu_memory_mib": 0}
        wanted.update({k: entry[k] for k in PROFILE_KEYS if k in entry})
        row = current.get(entry["name"])
        old = {k: getattr(row, k) for k in PROFILE_KEYS} if row else {}
        changed = _diff(old, wanted, PROFILE_KEYS)
        if (row is None or changed) and run.attempt(
            f"profiles[{i}]", device_profile_set, actor=None, name=entry["name"], **wanted
        ):
            run.changes.append(
                Change(
                    "profile",
                    entry["name"],
                    "changed" if row else "created",
                    changed if row else {},
                )
            )


def _retired(run: _Run, path: str, kind: str, row: Pool | Team | WorkloadClass) -> bool:
    """A retired row keeps its name: the file must give a new one another name."""
    if row.retired_at is None:
        return False
    run.errors.append(f"{path}.name: {kind} {row.name} is retired; give the new one a new name")
    return True


def _apply_section(
    run: _Run,
    *,
    kind: str,
    section: str,
    entries: list[dict[str, Any]],
    current: dict[str, Any],
    upsert: Callable[[_Run, str, dict[str, Any], Any], Any],
    retire: Callable[[Any], Any],
) -> None:
    """Create or update each listed row (`upsert` answers the row the file now manages, or
    None), then keep or, with --prune, retire the live rows the file no longer lists."""
    for i, entry in enumerate(entries):
        managed = upsert(run, f"{section}[{i}]", entry, current.get(entry["name"]))
        if managed is not None:
            _mark(managed)
    listed = {e["name"] for e in entries}
    for name, row in sorted(current.items()):
        if name in listed or row.retired_at is not None:
            continue
        if not run.prune:
            run.changes.append(Change(kind, name, "not in the file (kept; --prune retires it)"))
        elif run.attempt(f"{section}({name})", retire, row):
            run.changes.append(Change(kind, name, "retired"))


def _apply_pools(run: _Run, entries: list[dict[str, Any]]) -> None:
    _apply_section(
        run,
        kind="pool",
        section="pools",
        entries=entries,
        current={p.name: p for p in Pool.objects.all()},
        upsert=_pool_upsert,
        retire=lambda row: pool_retire(actor=None, pool=row, confirm=True),
    )


def _pool_upsert(run: _Run, path: str, entry: dict[str, Any], row: Pool | None) -> Pool | None:
    wanted = _pool_wanted(entry)
    fields = pool_fields_from_file(entry)
    if row is None:
        if run.attempt(path, pool_create, actor=None, config_managed=True, **fields):
            run.changes.append(Change("pool", entry["name"], "created"))
        return None
    if _retired(run, path, "pool", row):
        return None
    changed = _diff(pool_as_file(row), wanted, [k for k in wanted if k != "name"])
    fixed = [k for k in POOL_FIXED if k in changed]
    if fixed:
        run.errors.append(
            f"{path}.{fixed[0]}: cannot change on an existing pool (its nodes are what they are); "
            "retire it and add a new pool"
        )
        return None
    if changed:
        updates = {k: fields[k] for k in fields if k not in ("name", *POOL_FIXED)}
        if not wanted.get("autoscale"):
            updates = {k: v for k, v in updates.items() if k not in AUTOSCALE_KEYS}
        if run.attempt(path, pool_update, actor=None, pool=row, **updates):
            run.changes.append(Change("pool", row.name, "changed", changed))
    return row


def _apply_teams(run: _Run, entries: list[dict[str, Any]]) -> None:
    _apply_section(
        run,
        kind="team",
        section="teams",
        entries=entries,
        current={t.name: t for t in Team.objects.all()},
        upsert=_team_upsert,
        retire=lambda row: team_retire(actor=None, team=row, confirm=True),
    )


def _team_upsert(run: _Run, path: str, entry: dict[str, Any], row: Team | None) -> Team | None:
    wanted = _team_wanted(entry)
    fields = {k: wanted[k] for k in TEAM_KEYS}
    if row is None:
        if run.attempt(
            path, team_create, actor=None, name=entry["name"], config_managed=True, **fields
        ):
            run.changes.append(Change("team", entry["name"], "created"))
        return None
    if _retired(run, path, "team", row):
        return None
    changed = _diff({k: getattr(row, k) for k in TEAM_KEYS}, fields, TEAM_KEYS)
    if changed and run.attempt(
        path, team_update, actor=None, team=row, **{k: fields[k] for k in changed}
    ):
        run.changes.append(Change("team", row.name, "changed", changed))
    return row


def _apply_classes(run: _Run, entries: list[dict[str, Any]]) -> None:
    profiles = {d.name: d for d in DeviceProfile.objects.all()}
    teams = {t.name: t for t in Team.objects.filter(retired_at=None)}
    pools = {p.name: p for p in Pool.objects.filter(retired_at=None)}

    def upsert(
        run: _Run, path: str, entry: dict[str, Any], row: WorkloadClass | None
    ) -> WorkloadClass | None:
        return _class_upsert(run, path, entry, row, profiles=profiles, teams=teams, pools=pools)

    _apply_section(
        run,
        kind="class",
        section="classes",
        entries=entries,
        current={c.name: c for c in WorkloadClass.objects.select_related("default_profile")},
        upsert=upsert,
        retire=lambda row: workload_class_retire(actor=None, workload_class=row, confirm=True),
    )


def _class_upsert(
    run: _Run,
    path: str,
    entry: dict[str, Any],
    row: WorkloadClass | None,
    *,
    profiles: dict[str, DeviceProfile],
    teams: dict[str, Team],
    pools: dict[str, Pool],
) -> WorkloadClass | None:
    wanted = _class_wanted(entry)
    missing = [t for t in wanted["teams"] if t not in teams]
    if missing:
        run.errors.append(f"{path}.teams: no live team {missing[0]!r}")
        return None
    unknown = [p for p in wanted["pools"] if p not in pools]
    if unknown:
        run.errors.append(f"{path}.pools: no live pool {unknown[0]!r}")
        return None
    ref = wanted["default_profile"]
    if ref is not None and ref not in profiles:
        run.errors.append(f"{path}.default_profile: no profile {ref!r}")
        return None
    fields = {k: wanted[k] for k in CLASS_KEYS if k not in CLASS_LINKS}
    fields["default_profile"] = profiles[ref] if ref else None
    links = {
        "teams": [teams[t] for t in wanted["teams"]],
        "pools": [pools[p] for p in wanted["pools"]],
    }
    if row is None:
        if run.attempt(
            path,
            workload_class_create,
            actor=None,
            name=entry["name"],
            config_managed=True,
            **links,
            **fields,
        ):
            run.changes.append(Change("class", entry["name"], "created"))
        return None
    if _retired(run, path, "class", row):
        return None
    changed = _diff(class_as_file(row), wanted, CLASS_KEYS)
    if changed and run.attempt(
        path,
        workload_class_update,
        actor=None,
        workload_class=row,
        **links,
        **{k: v for k, v in fields.items() if k in changed},
    ):
        run.changes.append(Change("class", row.name, "changed", changed))
    return row


def _apply_quotas(run: _Run, entries: list[dict[str, Any]]) -> None:
    pools = {p.name: p for p in Pool.objects.filter(retired_at=None)}
    for i, entry in enumerate(entries):
        team = Team.objects.filter(name=entry["name"]).first()
        if team is None or team.retired_at is not None:
            continue  # its creation failed, or it is retired: reported already
        wanted = _team_wanted(entry)["quotas"]
        have = {q.pool.name: q for q in team.quotas.select_related("pool")}
        for pool_name, q in wanted.items():
            path = f"teams[{i}].quotas.{pool_name}"
            if pool_name not in pools:
                run.errors.append(f"{path}: no live pool {pool_name!r}")
                continue
            row = have.get(pool_name)
            old = {k: getattr(row, k) for k in QUOTA_KEYS} if row else {}
            changed = _diff(old, q, QUOTA_KEYS)
            if (row is None or changed) and run.attempt(
                path, quota_set, actor=None, team=team, pool=pools[pool_name], **q
            ):
                run.changes.append(
                    Change(
                        "quota",
                        f"{team.name}@{pool_name}",
                        "changed" if row else "created",
                        changed,
                    )
                )
        for pool_name in sorted(set(have) - set(wanted)):
            row = have[pool_name]
            if pool_name not in pools or not any(getattr(row, k) for k in QUOTA_KEYS):
                continue
            name = f"{team.name}@{pool_name}"
            if not run.prune:
                run.changes.append(
                    Change("quota", name, "not in the file (kept; --prune zeroes it)")
                )
                continue
            zero = {
                "nominal_milli": 0,
                "borrowing_limit_milli": 0,
                "lending_limit_milli": None,
                "granted_milli": 0,
            }
            if run.attempt(
                f"teams[{i}].quotas", quota_set, actor=None, team=team, pool=row.pool, **zero
            ):
                old = {k: getattr(row, k) for k in QUOTA_KEYS}
                run.changes.append(Change("quota", name, "changed", _diff(old, zero, QUOTA_KEYS)))


def _apply_scheduling_profile(run: _Run, entry: dict[str, Any]) -> None:
    name = entry["name"]
    knobs = {**scheduling_profile.load().knobs, **entry.get("knobs", {})}
    row = PolicyProfile.objects.filter(name=name).first()
    path = "scheduling_profile"
    if row is None:
        row = run.attempt(path, policy_profile_create, actor=None, name=name, knobs=knobs)
        if row is None:
            return
        run.changes.append(Change("scheduling profile", name, "created"))
    else:
        old = dict(row.profile().knobs)
        changed = _diff(old, knobs, sorted(set(old) | set(knobs)))
        if changed:
            if (
                run.attempt(path, policy_profile_update, actor=None, profile=row, knobs=knobs)
                is None
            ):
                return
            run.changes.append(Change("scheduling profile", name, "changed", changed))
    row.refresh_from_db()
    if not row.active and run.attempt(path, policy_profile_activate, actor=None, profile=row):
        run.changes.append(Change("scheduling profile", name, "changed", {"active": (False, True)}))
