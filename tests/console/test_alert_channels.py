"""The console's Alerts pages: admins see a webhook's secret once (after creating or rotating
it), disable, enable and delete channels; everyone else sees neither a target nor any part of
one hidden in an error (the list's failing channels, a rule's notifications and attempts)."""

import re

import pytest
from django.contrib.auth import get_user_model

from recovery.models import AlertRule, Notification, NotificationChannel
from tests.helpers import make_user

pytestmark = pytest.mark.django_db

SLACK = "https://hooks.slack.com/services/T0ABC/B0DEF/SLACKSECRETTOKEN"
WITH_CREDENTIALS = "http://ops:hunter2@10.1.2.3:15672/api/queues?token=abc"


def test_an_admin_sees_a_new_secret_once_and_manages_the_channel(logged_in):
    client = logged_in(make_user("chan-admin", "admin"))
    created = client.post(
        "/alerts/",
        {"channel-name": "hook", "channel-kind": "webhook", "channel-target": "http://h/x"},
        follow=True,
    )
    channel = NotificationChannel.objects.get()
    assert channel.secret in created.content.decode()
    assert channel.secret not in client.get("/alerts/").content.decode()  # once

    old = channel.secret
    rotated = client.post(f"/alerts/channels/{channel.pk}/rotate", follow=True)
    channel.refresh_from_db()
    assert channel.secret != old and channel.secret in rotated.content.decode()
    assert old not in rotated.content.decode()
    assert channel.secret not in client.get("/alerts/").content.decode()

    client.post(f"/alerts/channels/{channel.pk}/disable")
    channel.refresh_from_db()
    assert not channel.enabled
    client.post(f"/alerts/channels/{channel.pk}/enable")
    channel.refresh_from_db()
    assert channel.enabled
    client.post(f"/alerts/channels/{channel.pk}/delete")
    assert not NotificationChannel.objects.exists()


def test_only_admins_manage_channels(logged_in):
    channel = NotificationChannel.objects.create(name="hook", kind="webhook", target="http://h/")
    client = logged_in(make_user("chan-operator", "operator"))
    for action in ("rotate", "disable", "delete"):
        assert client.post(f"/alerts/channels/{channel.pk}/{action}").status_code == 403
    assert channel.secret not in client.get("/alerts/").content.decode()
    channel.refresh_from_db()
    assert channel.enabled


def test_a_superuser_reads_the_secret_again_in_django_admin(client):
    channel = NotificationChannel.objects.create(name="hook", kind="webhook", target="http://h/")
    client.force_login(get_user_model().objects.create_superuser("root", password="pw-root"))
    page = client.get(f"/admin/recovery/notificationchannel/{channel.pk}/change/")
    assert page.status_code == 200 and channel.secret in page.content.decode()


def _leaks(page):
    found = [s for s in ("SLACKSECRETTOKEN", "T0ABC", "hunter2", "ops:", "token=abc") if s in page]
    return found + re.findall(r"/api/queues", page)


def test_operators_see_only_scheme_and_host_in_errors(logged_in):
    slack = NotificationChannel.objects.create(
        name="slack",
        kind="slack",
        target=SLACK,
        consecutive_failures=5,
        last_error=f"HTTP 500 from {SLACK}",
    )
    mgmt = NotificationChannel.objects.create(
        name="mgmt",
        kind="webhook",
        target=WITH_CREDENTIALS,
        consecutive_failures=5,
        last_error=f"HTTP 401 from {WITH_CREDENTIALS}",
    )
    rule = AlertRule.objects.create(name="backlog", kind="open_messages")
    rule.channels.set([slack, mgmt])
    for channel in (slack, mgmt):
        error = f"HTTP 500 from {channel.target}"
        Notification.objects.create(
            rule=rule,
            channel=channel,
            event="firing",
            payload={},
            attempts=1,
            last_error=error,
            attempt_log=[{"at": "2026-11-26T10:00:00+00:00", "ok": False, "error": error}],
        )

    operator = logged_in(make_user("err-operator", "operator"))
    listing = operator.get("/alerts/").content.decode()
    detail = operator.get(f"/alerts/{rule.pk}/").content.decode()
    for page in (listing, detail):
        assert _leaks(page) == []
        assert "https://hooks.slack.com" in page and "http://10.1.2.3:15672" in page

    admin = logged_in(make_user("err-admin", "admin"))
    assert "SLACKSECRETTOKEN" in admin.get("/alerts/").content.decode()
    assert "SLACKSECRETTOKEN" in admin.get(f"/alerts/{rule.pk}/").content.decode()
