"""Single sign-on: the identity provider's groups become memberships and roles."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction

from portal.models import Membership, Team
from portal.services.audit import audit
from portal.services.teams import membership_remove, membership_set

SSO_ACTOR = "sso"


def sso_roles_from_groups(groups: Any) -> tuple[dict[str, str], set[str]]:
    """Map IdP groups through settings.OIDC_GROUP_MAP and each team's own `groups` (set by
    the config file): ({team name: role}, {platform roles}).

    A user in several groups of one team gets the highest role (lead over member).
    """
    names = {g for g in groups if isinstance(g, str)} if isinstance(groups, list | tuple) else set()
    teams: dict[str, str] = {}
    platform: set[str] = set()
    by_team = [
        (group, name, role)
        for name, mapping in Team.objects.exclude(groups={}).values_list("name", "groups")
        for group, role in sorted(mapping.items())
    ]
    for group, team, role in [*settings.OIDC_GROUP_MAP, *by_team]:
        if group not in names:
            continue
        if team == "*":
            platform.add(role)
        elif teams.get(team) != Membership.Role.LEAD:
            teams[team] = role
    return teams, platform


def sso_sync(*, user: User, groups: Any) -> dict[str, list[str]]:
    """Bring the user's memberships and platform roles in line with their IdP groups.

    Called at each sign-in. Memberships the map grants are created or changed (and marked
    `source=sso`; a member's cap stays); SSO memberships the groups no longer grant are
    removed through membership_remove, which cancels the member's pending requests there.
    Memberships leads added by hand are left alone. Platform roles (admin = staff,
    auditor = settings.AUDITOR_GROUP) follow the groups only for the roles the map names;
    a superuser is never demoted. Teams the map names but that do not exist are skipped
    and returned under "unknown_teams" (admins create teams; sign-in never does).
    """
    from django.contrib.auth.models import Group

    wanted, platform = sso_roles_from_groups(groups)
    teams = {t.name: t for t in Team.objects.filter(name__in=list(wanted))}
    changes: dict[str, list[str]] = {"set": [], "removed": [], "unknown_teams": []}
    changes["unknown_teams"] = sorted(set(wanted) - set(teams))
    with transaction.atomic():
        current = {
            m.team.name: m for m in Membership.objects.select_related("team").filter(user=user)
        }
        for name, role in sorted(wanted.items()):
            if name not in teams:
                continue
            m = current.get(name)
            if m is not None and m.role == role and m.source == Membership.Source.SSO:
                continue
            membership_set(
                actor=None,
                actor_name=SSO_ACTOR,
                team=teams[name],
                user=user,
                role=role,
                gpu_cap_milli=m.gpu_cap_milli if m is not None else None,
                source=Membership.Source.SSO,
            )
            changes["set"].append(f"{name}:{role}")
        for name, m in sorted(current.items()):
            if m.source == Membership.Source.SSO and name not in wanted:
                membership_remove(actor=None, membership=m, actor_name=SSO_ACTOR)
                changes["removed"].append(name)

        mapped = {role for _, team, role in settings.OIDC_GROUP_MAP if team == "*"}
        before = {"admin": bool(user.is_staff), "auditor": False}
        auditors, _ = Group.objects.get_or_create(name=settings.AUDITOR_GROUP)
        before["auditor"] = user.groups.filter(pk=auditors.pk).exists()
        after = dict(before)
        if "admin" in mapped and not user.is_superuser:
            after["admin"] = "admin" in platform
        if "auditor" in mapped:
            after["auditor"] = "auditor" in platform
        if after != before:
            if after["admin"] != before["admin"]:
                user.is_staff = after["admin"]
                user.save(update_fields=["is_staff"])
            if after["auditor"] and not before["auditor"]:
                user.groups.add(auditors)
            elif before["auditor"] and not after["auditor"]:
                user.groups.remove(auditors)
            user._qm_auditor = after["auditor"]  # type: ignore[attr-defined]
            audit(
                actor=None,
                actor_name=SSO_ACTOR,
                action="user.roles",
                obj=user,
                before={"user": user.get_username(), **before},
                after={"user": user.get_username(), **after},
            )
    return changes
