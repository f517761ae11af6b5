"""The OpenAPI schema's conventions that drf-spectacular does not infer from APIViews.

Every operation documents the error answers a client must handle: 400 (a
field or a query parameter is refused), 401 and 403 (credentials, roles),
404 (an object that is not there or not yours, where the path names one; a
page past the end of a list),
429 (throttled, with Retry-After), 500 and 503 (the database cannot be reached),
each as RFC 9457 problem details (`application/problem+json`, portal/lib/problems.py).
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import extend_schema_serializer
from rest_framework import serializers
from rest_framework.views import APIView

ERRORS = {
    "400": "The request was refused: `detail` says why, `errors` names each refused field.",
    "401": "No credentials, or credentials that are not valid.",
    "403": "Signed in, but not allowed to do this.",
    "404": "No such object, or not one of yours (for a list: no such page).",
    "429": "Too many requests; try again after the Retry-After header's seconds.",
    "500": "The server failed to answer; nothing about why is disclosed.",
    "503": "The database cannot be reached; try again after Retry-After.",
}
PROBLEM_MEDIA_TYPES = ["application/problem+json"]


class ProblemSerializer(serializers.Serializer[Any]):
    """An error as RFC 9457 problem details."""

    type = serializers.CharField(help_text="`urn:quartermaster:problem:<code>`")
    title = serializers.CharField(help_text="the HTTP status in words")
    status = serializers.IntegerField()
    detail = serializers.CharField(help_text="what went wrong, naming the fields at fault")
    code = serializers.CharField(
        help_text="stable, for scripts: invalid, parse_error, not_authenticated, "
        "authentication_failed, token_revoked, token_expired, permission_denied, token_scope, "
        "read_only_role, not_found, method_not_allowed, throttled, server_error, "
        "database_unavailable, idempotency_key_reused"
    )
    # (a field named like a Serializer attribute: the metaclass takes fields out of the class)
    errors = serializers.DictField(  # type: ignore[assignment]
        child=serializers.ListField(child=serializers.CharField()),
        required=False,
        help_text="for invalid input: each refused field and its messages",
    )


#: the name views written before problem details use (document their responses under
#: "application/problem+json", as `GpuRequestListSubmitApi.post` does)
ErrorSerializer = ProblemSerializer


class PersonalTokenScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call]
    """Personal access tokens in the schema: HTTP bearer (portal/auth/tokens.py)."""

    target_class = "portal.auth.tokens.PersonalTokenAuthentication"
    name = "personalToken"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "A personal access token (`qm_…`) from /me/tokens/ or "
            "POST /api/v1/tokens/. `Authorization: Token <secret>` is accepted as well.",
        }


class PortalAutoSchema(AutoSchema):
    def _get_response_bodies(self, direction: Any = "response") -> dict[str, Any]:
        responses: dict[str, Any] = super()._get_response_bodies(direction)
        if direction != "response":
            return responses
        for code, description in ERRORS.items():
            paged = getattr(self.view, "pagination_class", None) is not None
            if code == "404" and "{" not in self.path and not paged:
                continue
            if code not in responses:
                # (drf-spectacular leaves this method unannotated)
                body = self._get_response_for_code(  # type: ignore[no-untyped-call]
                    ProblemSerializer, code, media_types=PROBLEM_MEDIA_TYPES, direction=direction
                )
                body["description"] = description
                responses[code] = body
        return responses


def name_nested_serializers(namespace: dict[str, Any]) -> None:
    """Name each nested serializer after its view in the schema ("QueueApiOutput", not "Output").

    Each API module calls it on its own `globals()` once its views are defined.
    """
    for api_name, view in list(namespace.items()):
        if not (isinstance(view, type) and issubclass(view, APIView)):
            continue
        for attr, value in vars(view).items():
            if (
                isinstance(value, type)
                and issubclass(value, serializers.Serializer)
                and value.__qualname__.startswith(api_name)
            ):
                extend_schema_serializer(component_name=api_name + attr.removesuffix("Serializer"))(
                    value
                )
