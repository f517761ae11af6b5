"""The OpenAPI schema's conventions that drf-spectacular does not infer from APIViews.

Every operation documents the error answers a client must handle: 400 (a
field or a query parameter is refused), 401 and 403 (credentials, roles),
404 (an object that is not there or not yours, where the path names one; a
page past the end of a list),
429 (throttled, with Retry-After) and 503 (the database cannot be reached).
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import extend_schema_serializer
from rest_framework import serializers
from rest_framework.views import APIView

ERRORS = {
    "400": "The request was refused: `detail`, or each field named with its messages.",
    "401": "No credentials, or credentials that are not valid.",
    "403": "Signed in, but not allowed to do this.",
    "404": "No such object, or not one of yours (for a list: no such page).",
    "429": "Too many requests; try again after the Retry-After header's seconds.",
    "503": "The database cannot be reached; try again after Retry-After.",
}


class ErrorSerializer(serializers.Serializer[Any]):
    """`detail` for a whole-request error; otherwise each refused field names its messages."""

    detail = serializers.CharField(required=False)


class BearerTokenScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call]
    """`Authorization: Bearer <token>` in the schema, apart from DRF's `Token <token>`."""

    target_class = "portal.api.guards.BearerTokenAuthentication"
    name = "bearerAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {"type": "http", "scheme": "bearer"}


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
                    ErrorSerializer, code, direction=direction
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
