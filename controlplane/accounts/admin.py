"""Admin for teams, memberships and tokens. Token keys are never shown: only their prefix."""

from django.contrib import admin

from controlplane.accounts.models import ApiToken, Membership, Team


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "created_at"]
    search_fields = ["slug", "name"]
    prepopulated_fields = {"slug": ["name"]}
    inlines = [MembershipInline]


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["user", "team", "role", "created_at"]
    list_filter = ["role", "team"]
    search_fields = ["user__username", "team__slug"]
    list_select_related = ["user", "team"]


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Read mostly: tokens are created through the API (the key is shown once there)."""

    list_display = ["prefix", "kind", "team", "user", "instance", "name", "last_used_at", "expires_at", "revoked_at"]
    list_filter = ["kind", "team"]
    search_fields = ["prefix", "name", "user__username"]
    list_select_related = ["team", "user", "instance"]
    readonly_fields = ["prefix", "key_hash", "kind", "team", "user", "instance", "last_used_at", "created_at"]
    fields = [*readonly_fields, "name", "expires_at", "revoked_at"]

    def has_add_permission(self, request) -> bool:
        return False
