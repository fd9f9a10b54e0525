"""Django admin (/admin/, staff users): the alert channels, so a webhook's signing secret can be
read again after the console showed it once (docs/alerts.md)."""

from django.contrib import admin

from recovery.models import NotificationChannel


@admin.register(NotificationChannel)
class NotificationChannelAdmin(admin.ModelAdmin):
    list_display = ("name", "kind", "enabled", "consecutive_failures", "last_success_at")
    list_filter = ("kind", "enabled")
    # Changed through the console or the API (rotation), where it is logged.
    readonly_fields = ("secret", "consecutive_failures", "last_error", "last_success_at")
