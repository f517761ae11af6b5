"""What every API view shares: the base APIViews, pagination and the strict serializer."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import serializers, status
from rest_framework.exceptions import AuthenticationFailed, ValidationError
from rest_framework.pagination import PageNumberPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from portal import access

if TYPE_CHECKING:
    from django.contrib.auth.models import User


def _detail(exc: DjangoValidationError) -> dict[str, Any]:
    if hasattr(exc, "error_dict"):
        return {
            ("non_field_errors" if k == "__all__" else k): v for k, v in exc.message_dict.items()
        }
    return {"non_field_errors": exc.messages}


def signed_in_user(request: Request) -> User:
    """The caller of a view behind IsAuthenticated (the default permission): a stored user.

    DRF types `request.user` as possibly anonymous; the permission has refused those."""
    return access.signed_in(request.user)


class ApiView(APIView):
    """Turns a service's Django ValidationError into a 400 naming the field.

    Throttles count before credentials are refused: a wrong token or an
    anonymous call counts against the client's address (DRF would answer 401
    or 403 first and never count them, leaving token guessing unthrottled).
    """

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        try:
            user = request.user
        except AuthenticationFailed:
            self.check_throttles(request)
            raise
        if not user.is_authenticated:
            self.check_throttles(request)
            request._throttled = True  # type: ignore[attr-defined]
        super().initial(request, *args, **kwargs)

    def check_throttles(self, request: Request) -> None:
        if not getattr(request, "_throttled", False):
            super().check_throttles(request)

    def handle_exception(self, exc: Exception) -> Response:
        if isinstance(exc, DjangoValidationError):
            exc = ValidationError(detail=_detail(exc))
        return super().handle_exception(exc)


class ListApiView(ApiView):
    """A list answered a page at a time: `{"count", "next", "previous", "results": [...]}`.

    `pagination_class` is what tells the schema the response is a page, not an array.
    """

    pagination_class = PageNumberPagination


def paginate(
    view: APIView, request: Request, qs: Any, serializer: type[serializers.Serializer[Any]]
) -> Response:
    paginator = PageNumberPagination()
    page = paginator.paginate_queryset(qs, request, view=view)
    return paginator.get_paginated_response(serializer(page, many=True).data)


def validated(
    serializer: type[serializers.Serializer[Any]], request: Request, *, query: bool = False
) -> dict[str, Any]:
    """The request body as `serializer` checked it (a 400 naming each field it refuses); with
    `query`, a request without a body is read from its query string (a DELETE's options)."""
    data = (request.data or request.query_params.dict()) if query else request.data
    checked = serializer(data=data)
    checked.is_valid(raise_exception=True)
    return dict(checked.validated_data)


def created(data: Any) -> Response:
    """201 with the new object."""
    return Response(data, status=status.HTTP_201_CREATED)


class StrictSerializer(serializers.Serializer[Any]):
    """Rejects keys it does not know, so `namespace` or `nodeName` cannot ride along unnoticed."""

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        unknown = set(getattr(self, "initial_data", {}) or {}) - set(self.fields)
        if unknown:
            raise ValidationError({k: ["This field is not accepted."] for k in sorted(unknown)})
        return attrs
