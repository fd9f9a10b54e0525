"""Django admin (/admin/, staff users): the alert channels, so a webhook's signing secret can be
read again after the console showed it once (docs/alerts.md); teams, their scopes and
members (docs/security.md)."""

from django.contrib import admin

from recovery.models import Membership, NotificationChannel, Team, TeamScope


@admin.register(NotificationChannel)
class NotificationChannelAdmin(admin.ModelAdmin):
    list_display = ("name", "kind", "enabled", "consecutive_failures", "last_success_at")
    list_filter = ("kind", "enabled")
    # Changed through the console or the API (rotation), where it is logged.
    readonly_fields = ("secret", "consecutive_failures", "last_error", "last_success_at")


class TeamScopeInline(admin.TabularInline):
    model = TeamScope
    extra = 1


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 1
    autocomplete_fields = ("user",)


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    """Teams, their scopes and members in one form (the REST API does the same for admins)."""

    list_display = ("name", "created_at")
    search_fields = ("name",)
    inlines = (TeamScopeInline, MembershipInline)
