"""Alerts: the rules and their state (everyone sees them; admins change them), notification
channels with a test button, and the queues Lazarus cannot collect from."""

import datetime

from django.contrib import messages as flash
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from console.access import admin_required, viewer_required
from console.forms.alerts import AlertRuleForm, MuteForm, NotificationChannelForm
from recovery.alerts.deliver import send_test
from recovery.broker.coverage import uncovered_everywhere
from recovery.masking.policy import mask_for_display
from recovery.models import (
    Activity,
    AlertRule,
    NotificationChannel,
    has_role,
    scope_of,
    team_scoped,
)


@team_scoped
@login_required
@viewer_required
@require_http_methods(["GET", "POST"])
def alert_list(request):
    """Everyone sees the rules and channels of their scope (a team member: their teams')."""
    is_admin = has_role(request.user, "admin")
    rule_form = AlertRuleForm(request.POST or None, prefix="rule")
    channel_form = NotificationChannelForm(request.POST or None, prefix="channel")
    if request.method == "POST":
        if not is_admin:
            _forbidden()
        form = rule_form if "rule-name" in request.POST else channel_form
        if form.is_valid():
            with transaction.atomic():
                saved = form.save()
                Activity.record(
                    request.user,
                    f"{'alert_rule' if form is rule_form else 'channel'}_created",
                    saved,
                    via="console",
                )
            flash.success(request, f"Created {saved.name}.")
            if form is channel_form and saved.kind == NotificationChannel.Kind.WEBHOOK:
                _show_secret_once(request, saved)
            return redirect("alerts")
    scope = scope_of(request)
    rules = list(scope.owned(AlertRule.objects.prefetch_related("channels")))
    mask_for_display(rules)
    return render(
        request,
        "alerts/list.html",
        {
            "rules": rules,
            "channels": scope.owned(NotificationChannel.objects.all()),
            # Set by a create or a rotate just before, and shown on this page load only.
            "new_secret": request.session.pop(SECRET_SESSION_KEY, None) if is_admin else None,
            "rule_form": rule_form,
            "channel_form": channel_form,
            "is_admin": is_admin,
            "now": timezone.now(),
            "firing": sum(1 for r in rules if r.current_state == AlertRule.State.FIRING),
            "unknown": sum(1 for r in rules if r.current_state == AlertRule.State.UNKNOWN),
        },
    )


def _forbidden():
    raise PermissionDenied("requires the admin role")


# The secret travels from the POST to the page after its redirect in the (server-side) session,
# never in a URL or a cookie, and is popped by the first page that shows it.
SECRET_SESSION_KEY = "alerts_new_secret"


def _show_secret_once(request, channel):
    request.session[SECRET_SESSION_KEY] = {
        "id": channel.pk,
        "name": channel.name,
        "secret": channel.secret,
    }


@team_scoped
@login_required
@viewer_required
@require_http_methods(["GET", "POST"])
def alert_detail(request, pk):
    rule = get_object_or_404(scope_of(request).owned(AlertRule.objects.all()), pk=pk)
    form = AlertRuleForm(request.POST or None, instance=rule, prefix="rule")
    if request.method == "POST":
        if not has_role(request.user, "admin"):
            _forbidden()
        if form.is_valid():
            form.save()
            Activity.record(request.user, "alert_rule_changed", rule, via="console")
            flash.success(request, "Saved.")
            return redirect("alert", pk=rule.pk)
    transitions = list(rule.transitions.select_related("rule")[:100])
    # Past the form's save: the masked texts are for the page only.
    mask_for_display([rule], transitions)
    return render(
        request,
        "alerts/detail.html",
        {
            "rule": rule,
            "form": form,
            "mute_form": MuteForm(),
            "transitions": transitions,
            "notifications": rule.notifications.select_related("channel")[:50],
            "is_admin": has_role(request.user, "admin"),
            "now": timezone.now(),
        },
    )


@login_required
@admin_required
@require_POST
def alert_mute(request, pk):
    rule = get_object_or_404(AlertRule, pk=pk)
    form = MuteForm(request.POST)
    if form.is_valid():
        minutes = form.cleaned_data["minutes"]
        rule.muted_until = timezone.now() + datetime.timedelta(minutes=minutes) if minutes else None
        rule.save(update_fields=["muted_until"])
        Activity.record(request.user, "alert_rule_muted", rule, {"minutes": minutes}, via="console")
        flash.success(request, f"Muted for {minutes} min." if minutes else "Unmuted.")
    else:
        flash.error(request, "Mute: " + "; ".join(e for es in form.errors.values() for e in es))
    return redirect("alert", pk=rule.pk)


@login_required
@admin_required
@require_POST
def alert_delete(request, pk):
    rule = get_object_or_404(AlertRule, pk=pk)
    Activity.record(request.user, "alert_rule_deleted", rule, via="console")
    rule.delete()
    flash.success(request, f"Deleted {rule.name}.")
    return redirect("alerts")


@login_required
@admin_required
@require_POST
def channel_test(request, pk):
    channel = get_object_or_404(NotificationChannel, pk=pk)
    notification = send_test(channel, request.user)
    Activity.record(
        request.user, "channel_tested", channel, {"status": notification.status}, via="console"
    )
    if notification.status == notification.Status.DELIVERED:
        flash.success(request, f"Test notification delivered to {channel.name}.")
    else:
        flash.error(
            request,
            f"Test notification to {channel.name} failed: {notification.last_error} "
            "(it will be retried with backoff)",
        )
    return redirect("alerts")


@login_required
@admin_required
@require_POST
def channel_rotate_secret(request, pk):
    channel = get_object_or_404(NotificationChannel, pk=pk)
    channel.rotate_secret()
    Activity.record(request.user, "channel_secret_rotated", channel, via="console")
    _show_secret_once(request, channel)
    flash.success(request, f"New secret for {channel.name}: receivers must use it from now on.")
    return redirect("alerts")


@login_required
@admin_required
@require_POST
def channel_set_enabled(request, pk, enabled):
    channel = get_object_or_404(NotificationChannel, pk=pk)
    channel.enabled = enabled
    channel.save(update_fields=["enabled"])
    verb = "enabled" if enabled else "disabled"
    Activity.record(request.user, f"channel_{verb}", channel, via="console")
    flash.success(request, f"{channel.name} {verb}.")
    return redirect("alerts")


@login_required
@admin_required
@require_POST
def channel_delete(request, pk):
    channel = get_object_or_404(NotificationChannel, pk=pk)
    Activity.record(request.user, "channel_deleted", channel, via="console")
    channel.delete()
    flash.success(request, f"Deleted {channel.name}.")
    return redirect("alerts")


@login_required
@viewer_required
@require_GET
def uncovered_list(request):
    rows, unreachable = uncovered_everywhere()
    return render(request, "alerts/uncovered.html", {"rows": rows, "unreachable": unreachable})
