"""The access choke-point: every object a user touches is fetched through here.

Another team's objects answer 404, so their existence does not leak. Roles:
member and lead come from Membership; platform admins are staff users;
auditors (members of the Django group settings.AUDITOR_GROUP) read everything
admins read and change nothing: every unsafe method of theirs answers 403
(ReadOnlyRoleMiddleware for pages, ReadOnlyRolePermission for the API), and
the object checks below refuse them writes as well.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, cast

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser, User
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse

from portal.models import (
    Device,
    GpuRequest,
    Membership,
    Node,
    PersonalToken,
    PolicyProfile,
    Pool,
    RequestTemplate,
    Rollout,
    Team,
    WorkloadClass,
)

AnyUser = AbstractBaseUser | AnonymousUser

# Failed authorization is logged (ASVS 16.3.2): who, what, which id.
security_log = logging.getLogger("portal.security")


def _denied(user: AnyUser, what: str, pk: Any, exc: type[Exception], message: str) -> Exception:
    security_log.warning(
        "access denied: user=%s %s=%s (%s)", getattr(user, "pk", None), what, pk, exc.__name__
    )
    return exc(message)


def signed_in(user: AnyUser) -> User:
    """The user model behind a request's user, once `is_authenticated` has been checked (DRF and
    Django type `request.user` as any user; this site's user model is `User`)."""
    return cast(User, user)


#: set on the user by the API's token authentication: the scope of the token it came with
TOKEN_SCOPE_ATTR = "_qm_token_scope"


def is_admin(user: AnyUser) -> bool:
    """A platform admin; over the API with a token, only with an `admin`-scoped one (an admin's
    `read+submit` token for a script cannot change pools or other teams' quotas)."""
    if getattr(user, TOKEN_SCOPE_ATTR, PersonalToken.Scope.ADMIN) != PersonalToken.Scope.ADMIN:
        return False
    return bool(user.is_authenticated and user.is_active and getattr(user, "is_staff", False))


def is_auditor(user: AnyUser) -> bool:
    """In the auditors' group (and active); remembered on the user object for the request."""
    if not (user.is_authenticated and user.is_active):
        return False
    cached = getattr(user, "_qm_auditor", None)
    if cached is None:
        cached = signed_in(user).groups.filter(name=settings.AUDITOR_GROUP).exists()
        setattr(user, "_qm_auditor", cached)  # noqa: B010 (a per-request memo, not a model field)
    return bool(cached)


def is_read_only(user: AnyUser) -> bool:
    """An auditor who is not also an admin: may read what admins read, may change nothing."""
    return is_auditor(user) and not is_admin(user)


def sees_all(user: AnyUser) -> bool:
    """Admins and auditors read every team's requests, decisions, capacity and the audit log."""
    return is_admin(user) or is_auditor(user)


def teams_for(user: AnyUser) -> QuerySet[Team]:
    if not user.is_authenticated:
        return Team.objects.none()
    if sees_all(user):
        return Team.objects.all()
    return Team.objects.filter(memberships__user=signed_in(user)).distinct()


def role_in(user: AnyUser, team: Team) -> str | None:
    if not user.is_authenticated:
        return None
    m = Membership.objects.filter(user=signed_in(user), team=team).only("role").first()
    return m.role if m else None


def get_team_for_user(user: AnyUser, pk: int | str, *, role: str | None = None) -> Team:
    """The team if the user may see it; with role="lead", only its leads and admins."""
    try:
        team = teams_for(user).filter(pk=int(pk)).first()
    except (ValueError, TypeError):
        team = None
    if team is None:
        raise _denied(user, "team", pk, Http404, "No such team.")
    if (
        role == Membership.Role.LEAD
        and not is_admin(user)
        and role_in(user, team) != Membership.Role.LEAD
    ):
        raise _denied(user, "team", pk, PermissionDenied, "Only the team's leads may do this.")
    return team


def requests_visible(user: AnyUser) -> QuerySet[GpuRequest]:
    """Requests of the user's teams (all of them for admins)."""
    qs = GpuRequest.objects.select_related("team", "workload_class", "pool", "submitted_by")
    if sees_all(user):
        return qs
    return qs.filter(team__in=teams_for(user))


def get_gpu_request_for_user(user: AnyUser, pk: int | str, *, write: bool = False) -> GpuRequest:
    """A request of one of the user's teams; writing needs its submitter, a team lead or an admin."""
    try:
        req = requests_visible(user).get(pk=int(pk))
    except (GpuRequest.DoesNotExist, ValueError, TypeError):
        raise _denied(user, "request", pk, Http404, "No such request.") from None
    if write and not is_admin(user):
        own = req.submitted_by_id == user.pk
        lead = role_in(user, req.team) == Membership.Role.LEAD
        if not (own or lead):
            raise _denied(
                user,
                "request",
                pk,
                PermissionDenied,
                "Only the submitter or a team lead may change this request.",
            )
    return req


def get_template_for_user(user: AnyUser, pk: int | str) -> RequestTemplate:
    """One of the user's own saved request templates (nobody else's, admins included)."""
    try:
        return RequestTemplate.objects.get(pk=int(pk), user=signed_in(user))
    except (RequestTemplate.DoesNotExist, ValueError, TypeError):
        raise _denied(user, "template", pk, Http404, "No such template.") from None


def get_token_for_user(user: AnyUser, pk: int | str, *, write: bool = False) -> PersonalToken:
    """A personal access token: the user's own; anyone's to read for admins and auditors, to
    revoke for admins."""
    try:
        qs = PersonalToken.objects.select_related("user")
        if not (is_admin(user) if write else sees_all(user)):
            qs = qs.filter(user=signed_in(user))
        return qs.get(pk=int(pk))
    except (PersonalToken.DoesNotExist, ValueError, TypeError):
        raise _denied(user, "token", pk, Http404, "No such token.") from None


def require_admin(user: AnyUser) -> None:
    if not is_admin(user):
        raise _denied(user, "admin", "-", PermissionDenied, "Platform admins only.")


def require_admin_read(user: AnyUser) -> None:
    """Pages and lists that admins and auditors read (capacity, audit log, settings)."""
    if not sees_all(user):
        raise _denied(
            user, "admin-read", "-", PermissionDenied, "Platform admins and auditors only."
        )


SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
#: unsafe requests an auditor may still make: ending their own session, keeping their own
#: (read-scoped) API tokens
READ_ONLY_ALLOWED_PATHS = (
    "/accounts/logout/",
    "/oidc/logout/",
    "/me/tokens/",
    "/me/tokens/revoke/",
)


class ReadOnlyRoleMiddleware:
    """403 for every unsafe method of a read-only user (an auditor), whatever the view.

    The API's token users are checked by ReadOnlyRolePermission instead: DRF authenticates
    tokens after the middleware has run.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if (
            request.method not in SAFE_METHODS
            and request.path not in READ_ONLY_ALLOWED_PATHS
            and is_read_only(request.user)
        ):
            security_log.warning(
                "access denied: user=%s read-only %s %s",
                request.user.pk,
                request.method,
                request.path,
            )
            message = "Auditors may read but not change anything."
            if request.path.startswith("/api/"):
                return JsonResponse({"detail": message}, status=403)
            raise PermissionDenied(message)
        return self.get_response(request)


def get_membership_for_lead(user: AnyUser, team: Team, pk: int | str) -> Membership:
    """A membership of `team`, which the caller already fetched with role="lead"."""
    try:
        return Membership.objects.select_related("user").get(team=team, pk=int(pk))
    except (Membership.DoesNotExist, ValueError, TypeError):
        raise _denied(user, "membership", pk, Http404, "No such member.") from None


def get_pool(user: AnyUser, pk: int | str) -> Pool:
    """Pools are shared inventory: every signed-in user may read them; only admins change them."""
    if not user.is_authenticated:
        raise PermissionDenied("Sign in first.")
    try:
        return Pool.objects.get(pk=int(pk))
    except (Pool.DoesNotExist, ValueError, TypeError):
        raise Http404("No such pool.") from None


def get_pool_for_admin(user: AnyUser, pk: int | str) -> Pool:
    require_admin(user)
    return get_pool(user, pk)


def get_node_for_admin(user: AnyUser, pk: int | str) -> Node:
    require_admin(user)
    try:
        return Node.objects.select_related("pool").get(pk=int(pk))
    except (Node.DoesNotExist, ValueError, TypeError):
        raise Http404("No such node.") from None


def get_device_for_admin(user: AnyUser, pk: int | str) -> Device:
    require_admin(user)
    try:
        return Device.objects.select_related("node").get(pk=int(pk))
    except (Device.DoesNotExist, ValueError, TypeError):
        raise Http404("No such device.") from None


def get_workload_class_for_admin(user: AnyUser, pk: int | str) -> WorkloadClass:
    require_admin(user)
    try:
        return WorkloadClass.objects.get(pk=int(pk))
    except (WorkloadClass.DoesNotExist, ValueError, TypeError):
        raise Http404("No such workload class.") from None


def get_policy_profile_for_admin(
    user: AnyUser, pk: int | str, *, read_only: bool = False
) -> PolicyProfile:
    """A scheduling profile: admins change it; admins and auditors read it (`read_only`)."""
    if read_only:
        require_admin_read(user)
    else:
        require_admin(user)
    try:
        return PolicyProfile.objects.get(pk=int(pk))
    except (PolicyProfile.DoesNotExist, ValueError, TypeError):
        raise Http404("No such scheduling profile.") from None


def get_rollout(user: AnyUser, pk: int | str, *, read_only: bool = False) -> Rollout:
    """A rollout: admins halt it; admins and auditors read it (`read_only`)."""
    if read_only:
        require_admin_read(user)
    else:
        require_admin(user)
    try:
        return Rollout.objects.select_related("pool", "created_by").get(pk=int(pk))
    except (Rollout.DoesNotExist, ValueError, TypeError):
        raise Http404("No such rollout.") from None
