"""Alert rules and channels through their whole life in the API: rules are changed (PATCH),
muted, unmuted and deleted; channels created (their secret shown once), changed, disabled,
rotated and deleted; by admins only. Non-admins never see a target, not even inside an error."""

import pytest
import yaml
from django.utils import timezone

from recovery.models import Activity, AlertRule, Notification, NotificationChannel

pytestmark = pytest.mark.django_db

SLACK = "https://hooks.slack.com/services/T0ABC/B0DEF/SLACKSECRETTOKEN"
WITH_CREDENTIALS = "http://ops:hunter2@10.1.2.3:15672/api/queues?token=abc"


def test_it_changes_mutes_unmutes_and_deletes_a_rule(admin_api, operator_api, viewer_api):
    made = admin_api.post("/api/v1/alert-rules", {"name": "backlog", "kind": "open_messages"})
    assert made.status_code == 201, made.content
    path = f"/api/v1/alert-rules/{made.json()['id']}"

    changed = admin_api.request(
        "PATCH",
        path,
        {"name": "big backlog", "params": {"threshold": 500}, "remind_every_seconds": 600},
    )
    assert changed.status_code == 200, changed.content
    assert changed.json()["remind_every_seconds"] == 600
    rule = AlertRule.objects.get()
    assert (rule.name, rule.params, rule.remind_every.total_seconds()) == (
        "big backlog",
        {"threshold": 500},
        600,
    )
    # A PATCH that would make the saved params wrong for the kind is refused as a whole.
    refused = admin_api.request("PATCH", path, {"kind": "open_growth", "name": "x"})
    assert refused.status_code == 400 and "params" in refused.json()["errors"]
    assert AlertRule.objects.get().kind == "open_messages"
    assert admin_api.request("PUT", path, {"name": "x"}).status_code == 405

    muted = admin_api.post(f"{path}/mute", {"minutes": 30})
    assert muted.status_code == 200 and muted.json()["muted_until"], muted.content
    assert AlertRule.objects.get().muted()
    assert admin_api.post(f"{path}/mute", {"minutes": 0}).status_code == 400
    unmuted = admin_api.post(f"{path}/unmute")
    assert unmuted.status_code == 200 and unmuted.json()["muted_until"] is None
    assert not AlertRule.objects.get().muted()

    for other in (operator_api, viewer_api):
        assert other.request("PATCH", path, {"name": "mine"}).status_code == 403
        assert other.post(f"{path}/mute", {"minutes": 5}).status_code == 403
        assert other.post(f"{path}/unmute").status_code == 403
        assert other.request("DELETE", path).status_code == 403
    assert viewer_api.get(path).json()["name"] == "big backlog"

    assert admin_api.request("DELETE", path).status_code == 204
    assert not AlertRule.objects.exists()
    assert admin_api.get(path).status_code == 404
    assert set(Activity.objects.filter(via="api").values_list("action", flat=True)) >= {
        "alert_rule_created",
        "alert_rule_changed",
        "alert_rule_muted",
        "alert_rule_deleted",
    }


def test_an_admin_creates_a_channel_and_sees_its_secret_once(admin_api, viewer_api):
    made = admin_api.post(
        "/api/v1/alert-channels", {"name": "hook", "kind": "webhook", "target": "http://h/x"}
    )
    assert made.status_code == 201, made.content
    channel = NotificationChannel.objects.get()
    assert made.json()["secret"] == channel.secret and len(channel.secret) >= 32
    path = f"/api/v1/alert-channels/{channel.pk}"
    assert "secret" not in admin_api.get(path).json()
    assert all("secret" not in c for c in admin_api.get("/api/v1/alert-channels").json()["results"])

    rotated = admin_api.post(f"{path}/rotate-secret")
    assert rotated.status_code == 200, rotated.content
    channel.refresh_from_db()
    assert rotated.json()["secret"] == channel.secret != made.json()["secret"]

    disabled = admin_api.request("PATCH", path, {"enabled": False, "target": "https://h/y"})
    assert disabled.status_code == 200, disabled.content
    channel.refresh_from_db()
    assert (channel.enabled, channel.target) == (False, "https://h/y")
    assert admin_api.request("PATCH", path, {"target": "ftp://h/"}).status_code == 400
    assert admin_api.request("PATCH", path, {"kind": "email"}).status_code == 400

    denied = viewer_api.post(
        "/api/v1/alert-channels", {"name": "v", "kind": "webhook", "target": "http://h/"}
    )
    assert denied.status_code == 403
    assert viewer_api.post(f"{path}/rotate-secret").status_code == 403
    assert viewer_api.request("PATCH", path, {"enabled": True}).status_code == 403
    assert viewer_api.request("DELETE", path).status_code == 403

    assert admin_api.request("DELETE", path).status_code == 204
    assert not NotificationChannel.objects.exists()


def test_it_refuses_a_bad_channel_and_saves_nothing(admin_api):
    for body in (
        {"name": "a", "kind": "webhook", "target": "not a url"},
        {"name": "b", "kind": "email", "target": "nobody"},
        {"name": "c", "kind": "sms", "target": "+1"},
        {"name": "d\u0000", "kind": "webhook", "target": "http://h/"},
        {"name": "e", "kind": "slack", "target": "http://h/\u0000"},
    ):
        response = admin_api.post("/api/v1/alert-channels", body)
        assert response.status_code == 400, (body, response.content)
    assert not NotificationChannel.objects.exists()


def test_errors_name_only_scheme_and_host_to_non_admins(admin_api, viewer_api, operator_api):
    slack = NotificationChannel.objects.create(
        name="slack", kind="slack", target=SLACK, last_error=f"HTTP 500 from {SLACK}"
    )
    NotificationChannel.objects.create(
        name="mgmt",
        kind="webhook",
        target=WITH_CREDENTIALS,
        last_error=f"URLError: <urlopen error [Errno 111] {WITH_CREDENTIALS}>",
    )
    Notification.objects.create(channel=slack, event="test", payload={})
    # http.client quotes only the path of a URL it refuses.
    NotificationChannel.objects.create(
        name="spaced",
        kind="webhook",
        target="http://10.9.9.9/a b/SPACEDSECRET",
        last_error="InvalidURL: URL can't contain control characters. '/a b/SPACEDSECRET' "
        "(found at least ' ')",
    )
    NotificationChannel.objects.create(
        name="mail",
        kind="email",
        target="oncall@example.com",
        last_error="SMTPRecipientsRefused: {'oncall@example.com': (550, b'no')}",
    )
    for who in (viewer_api, operator_api):
        listed = who.get("/api/v1/alert-channels").content.decode()
        assert "SLACKSECRETTOKEN" not in listed and "T0ABC" not in listed
        assert "hunter2" not in listed and "ops:" not in listed and "token=abc" not in listed
        assert "/api/queues" not in listed
        assert "SPACEDSECRET" not in listed and "oncall@" not in listed
        assert "…@example.com" in listed
        assert "HTTP 500 from https://hooks.slack.com" in listed
        assert "http://10.1.2.3:15672" in listed
        one = who.get(f"/api/v1/alert-channels/{slack.pk}").json()
        assert one["last_error"] == "HTTP 500 from https://hooks.slack.com"
        assert one["target"] is None
    full = admin_api.get(f"/api/v1/alert-channels/{slack.pk}").json()
    assert full["last_error"] == f"HTTP 500 from {SLACK}" and full["target"] == SLACK


def test_a_rule_that_cannot_check_is_unknown_in_the_api_and_its_schema(viewer_api, client):
    now = timezone.now()
    blind = AlertRule.objects.create(
        name="blind",
        kind="broker_alarm",
        state="unknown",
        last_known_state="firing",
        last_error="ManagementError: management API unreachable",
        last_evaluated_at=now,
    )
    AlertRule.objects.create(name="never", kind="audit")  # beat never looked at it
    AlertRule.objects.create(name="fine", kind="audit", last_evaluated_at=now)

    one = viewer_api.get(f"/api/v1/alert-rules/{blind.pk}").json()
    assert (one["state"], one["last_known_state"]) == ("unknown", "firing")
    assert one["unknown_reason"] == "cannot check: ManagementError: management API unreachable"
    listed = {r["name"]: r for r in viewer_api.get("/api/v1/alert-rules").json()["results"]}
    assert (listed["never"]["state"], listed["never"]["unknown_reason"]) == (
        "unknown",
        "never evaluated",
    )
    assert (listed["fine"]["state"], listed["fine"]["unknown_reason"]) == ("ok", "")

    schema = yaml.safe_load(client.get("/api/schema/").content)
    fields = schema["components"]["schemas"]["AlertRule"]["properties"]
    assert {"unknown_reason", "last_known_state"} <= set(fields)
    states = fields["state"].get("enum") or _enum(schema, fields["state"])
    assert set(states) == {"ok", "firing", "unknown"}


def _enum(schema, field):
    """A choice field's values, where drf-spectacular names the enum as a component."""
    refs = [field] + field.get("allOf", [])
    for ref in refs:
        if "$ref" in ref:
            return schema["components"]["schemas"][ref["$ref"].rsplit("/", 1)[1]]["enum"]
    return []
