"""The access choke-point: every object a user touches is fetched through here.

Another team's objects answer 404, so their existence does not leak. Roles:
member and lead come from Membership; platform admins are staff users.
"""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import Http404

from portal.models import GpuRequest, Membership, Team

AnyUser = AbstractBaseUser | AnonymousUser


def is_admin(user: AnyUser) -> bool:
    return bool(user.is_authenticated and user.is_active and getattr(user, "is_staff", False))


def teams_for(user: AnyUser) -> QuerySet[Team]:
    if not user.is_authenticated:
        return Team.objects.none()
    if is_admin(user):
        return Team.objects.all()
    return Team.objects.filter(memberships__user=user).distinct()


def role_in(user: AnyUser, team: Team) -> str | None:
    if not user.is_authenticated:
        return None
    m = Membership.objects.filter(user=user, team=team).only("role").first()
    return m.role if m else None


def get_team_for_user(user: AnyUser, pk: int | str, *, role: str | None = None) -> Team:
    """The team if the user may see it; with role="lead", only its leads and admins."""
    team = teams_for(user).filter(pk=pk).first()
    if team is None:
        raise Http404("No such team.")
    if role == Membership.Role.LEAD and not is_admin(user) and role_in(user, team) != Membership.Role.LEAD:
        raise PermissionDenied("Only the team's leads may do this.")
    return team


def requests_visible(user: AnyUser) -> QuerySet[GpuRequest]:
    """Requests of the user's teams (all of them for admins)."""
    qs = GpuRequest.objects.select_related("team", "workload_class", "pool", "submitted_by")
    if is_admin(user):
        return qs
    return qs.filter(team__in=teams_for(user))


def get_gpu_request_for_user(user: AnyUser, pk: int | str, *, write: bool = False) -> GpuRequest:
    """A request of one of the user's teams; writing needs its submitter, a team lead or an admin."""
    try:
        req = requests_visible(user).get(pk=int(pk))
    except (GpuRequest.DoesNotExist, ValueError, TypeError):
        raise Http404("No such request.") from None
    if write and not is_admin(user):
        own = req.submitted_by_id == user.pk
        lead = role_in(user, req.team) == Membership.Role.LEAD
        if not (own or lead):
            raise PermissionDenied("Only the submitter or a team lead may change this request.")
    return req


def require_admin(user: AnyUser) -> None:
    if not is_admin(user):
        raise PermissionDenied("Platform admins only.")
