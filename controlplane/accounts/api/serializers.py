"""Serializers of the accounts API."""

from __future__ import annotations

from rest_framework import serializers

from controlplane.accounts.models import ApiToken, Membership, Role, Team, TokenKind
from controlplane.common.api import NamedChoiceField
from controlplane.common.fields import CharField, EmailField, ModelSerializer, SlugField
from controlplane.common.limits import MAX_ID


class TeamSerializer(ModelSerializer):
    my_role = serializers.ChoiceField(choices=Role.choices, read_only=True, allow_null=True,
                                      help_text="The requester's role in the team.")
    member_count = serializers.IntegerField(read_only=True)

    class Meta:
        model = Team
        fields = ["id", "name", "slug", "my_role", "member_count", "created_at"]
        read_only_fields = fields


class ApiTokenSerializer(ModelSerializer):
    kind = NamedChoiceField(choices=TokenKind.choices, enum_name="TokenKindEnum", read_only=True)
    username = CharField(source="user.username", read_only=True, allow_null=True, default=None)

    class Meta:
        model = ApiToken
        fields = ["id", "team", "kind", "name", "prefix", "user", "username", "instance",
                  "created_at", "last_used_at", "expires_at", "revoked_at"]
        read_only_fields = fields


class ApiTokenCreatedSerializer(ApiTokenSerializer):
    key = CharField(read_only=True, help_text="The secret key. Shown once, never stored.")

    class Meta(ApiTokenSerializer.Meta):
        fields = [*ApiTokenSerializer.Meta.fields, "key"]
        read_only_fields = fields


class ApiTokenCreateSerializer(serializers.Serializer):
    """Input of `POST /tokens/`. `team` may be left out when the requester has exactly one team."""

    team = serializers.IntegerField(required=False, min_value=1, max_value=MAX_ID)
    kind = NamedChoiceField(choices=TokenKind.choices, enum_name="TokenKindEnum", default=TokenKind.USER)
    name = CharField(max_length=100, required=False, allow_blank=True, default="")
    instance = serializers.IntegerField(
        required=False, min_value=1, max_value=MAX_ID,
        help_text="Required for agent tokens.",
    )
    expires_at = serializers.DateTimeField(required=False, allow_null=True, default=None)


class TeamCreateSerializer(serializers.Serializer):
    """Input of `POST /teams/` (staff only): the team and its first admin."""

    name = CharField(max_length=100)
    slug = SlugField(max_length=60, required=False, help_text="Default: from the name.")
    admin = CharField(max_length=150, help_text="Username of the first admin; created when new.")
    admin_email = EmailField(required=False, allow_blank=True, default="", max_length=254)
    token_name = CharField(max_length=100, required=False, default="first token")


class TeamAdminSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    username = CharField()
    created = serializers.BooleanField(help_text="true: a new user (no usable password) was made.")


class TeamCreatedSerializer(serializers.Serializer):
    """Answer of `POST /teams/`: the team, its admin and the admin's token with its key (shown once)."""

    team = TeamSerializer()
    admin = TeamAdminSerializer()
    token = ApiTokenCreatedSerializer()


class MembershipSerializer(ModelSerializer):
    user = serializers.IntegerField(source="user_id", read_only=True)
    username = CharField(source="user.username", read_only=True)
    email = CharField(source="user.email", read_only=True)
    role = NamedChoiceField(choices=Role.choices, enum_name="RoleEnum", read_only=True)

    class Meta:
        model = Membership
        fields = ["user", "username", "email", "role", "created_at", "updated_at"]
        read_only_fields = fields


class MembershipCreateSerializer(serializers.Serializer):
    """Input of `POST /teams/{id}/members/`: an existing user by username."""

    username = CharField(max_length=150)
    role = NamedChoiceField(choices=Role.choices, enum_name="RoleEnum", default=Role.MEMBER)


class MembershipUpdateSerializer(serializers.Serializer):
    role = NamedChoiceField(choices=Role.choices, enum_name="RoleEnum")
