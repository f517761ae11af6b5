"""Personal access tokens over the API: list, create (the secret answered once), revoke."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from portal import access
from portal.api.base import ApiView, ListApiView, StrictSerializer, paginate, signed_in_user
from portal.api.schema import name_nested_serializers
from portal.models import PersonalToken
from portal.selectors.tokens import token_list
from portal.services.tokens import token_create, token_revoke


class TokenOutputSerializer(serializers.Serializer[Any]):
    id = serializers.IntegerField()
    user = serializers.CharField(source="user.username")
    name = serializers.CharField()
    prefix = serializers.CharField(help_text="the secret's first characters, to tell tokens apart")
    scope = serializers.ChoiceField(choices=PersonalToken.Scope.values)
    state = serializers.SerializerMethodField(help_text='"active", "revoked" or "expired"')
    created_at = serializers.DateTimeField()
    expires_at = serializers.DateTimeField()
    last_used_at = serializers.DateTimeField(allow_null=True)
    revoked_at = serializers.DateTimeField(allow_null=True)

    def get_state(self, token: PersonalToken) -> str:
        return token.state_at(timezone.now())


class TokenCreatedSerializer(TokenOutputSerializer):
    secret = serializers.CharField(
        help_text="the token itself, shown this once: send it as `Authorization: Bearer <secret>`"
    )


class TokenListCreateApi(ListApiView):
    """The caller's tokens (admins and auditors list anyone's with `?user=` or `?all=1`);
    create one."""

    class InputSerializer(StrictSerializer):
        name = serializers.CharField(max_length=100)
        scope = serializers.ChoiceField(
            choices=PersonalToken.Scope.values, default=PersonalToken.Scope.SUBMIT
        )
        expires_in_days = serializers.IntegerField(
            required=False,
            min_value=1,
            help_text="default PERSONAL_TOKEN_DAYS (90); at most PERSONAL_TOKEN_MAX_DAYS",
        )

    @extend_schema(
        operation_id="tokens_list",
        parameters=[
            OpenApiParameter("user", str, description="admins: this user's tokens"),
            OpenApiParameter("all", bool, description="admins: every user's tokens"),
        ],
        responses=TokenOutputSerializer(many=True),
    )
    def get(self, request: Request) -> Response:
        owner: User | None = signed_in_user(request)
        username = request.query_params.get("user", "")
        every = request.query_params.get("all", "") in ("1", "true")
        if username or every:
            access.require_admin_read(request.user)
            owner = None
        qs = token_list(user=owner)
        if username:
            qs = qs.filter(user__username=username)
        return paginate(self, request, qs, TokenOutputSerializer)

    @extend_schema(
        operation_id="tokens_create",
        request=InputSerializer,
        responses={201: TokenCreatedSerializer},
    )
    def post(self, request: Request) -> Response:
        serializer = self.InputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        token, secret = token_create(
            user=signed_in_user(request),
            name=data["name"],
            scope=data["scope"],
            expires_in_days=data.get("expires_in_days"),
        )
        body = {**TokenOutputSerializer(token).data, "secret": secret}
        return Response(body, status=status.HTTP_201_CREATED)


class TokenDetailApi(ApiView):
    """One token (the caller's own, or anyone's for an admin); DELETE revokes it at once."""

    @extend_schema(operation_id="tokens_retrieve", responses=TokenOutputSerializer)
    def get(self, request: Request, token_id: int) -> Response:
        token = access.get_token_for_user(request.user, token_id)
        return Response(TokenOutputSerializer(token).data)

    @extend_schema(operation_id="tokens_revoke", request=None, responses={204: None})
    def delete(self, request: Request, token_id: int) -> Response:
        token = access.get_token_for_user(request.user, token_id, write=True)
        token_revoke(token=token, actor=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)


name_nested_serializers(globals())
