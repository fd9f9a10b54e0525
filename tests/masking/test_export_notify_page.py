"""Exports and notifications are masked too; the masking page's bad input and its "matched 0"
(#32)."""

import base64
import json

import pytest
from django.utils import timezone

from recovery.alerts.deliver import deliver_due, text_of
from recovery.alerts.engine import evaluate
from recovery.models import Activity, AlertRule, MaskRule, ReplayJob, set_privileges
from tests.helpers import make_message, make_user
from tests.helpers.alerts import Receiver, webhook

pytestmark = pytest.mark.django_db

TOKEN = "tok_live_31337abc"
CARD = "5500005555555559"


@pytest.fixture
def rules():
    MaskRule.objects.create(kind="regex", pattern=r"tok_live_[0-9a-f]+")
    MaskRule.objects.create(kind="json_path", pattern="$.card")
    MaskRule.objects.create(kind="header", pattern="x-token")


@pytest.fixture
def exporter():
    user = make_user("exa", "viewer")
    set_privileges(user, export=True)
    return user


def _export(client, **filters):
    response = client.get("/messages/export", filters)
    return response, b"".join(response.streaming_content) if response.streaming else b""


def test_an_export_is_masked_json_lines_and_logged(client, exporter, rules):
    kept = make_message(
        source_queue="exports",
        body=json.dumps({"card": CARD, "note": f"t {TOKEN}"}).encode(),
        headers={"x-token": TOKEN},
    )
    make_message(source_queue="elsewhere", body=b"other")
    client.force_login(exporter)
    response, content = _export(client, queue="exports")
    assert response.status_code == 200 and response["Content-Type"] == "application/x-ndjson"
    [line] = [json.loads(row) for row in content.decode().splitlines()]
    body = base64.b64decode(line["body_base64"]).decode()
    assert line["id"] == kept.pk and line["masked"] is True
    assert CARD not in body and TOKEN not in body and "[masked]" in body
    assert TOKEN not in content.decode()
    assert line["headers"]["x-token"] == "[masked]"
    logged = Activity.objects.get(action="export", user=exporter)
    assert logged.detail["messages"] == 1 and logged.detail["filters"] == {"queue": "exports"}
    view = Activity.objects.get(action="body_view", message=kept)
    assert view.detail["how"] == "export" and view.user == exporter


def test_export_is_a_privilege_of_its_own(client, api, viewer, rules):
    make_message()
    client.force_login(viewer)
    assert client.get("/messages/export").status_code == 403
    assert api.as_user(viewer).get("/api/v1/messages/export").status_code == 403
    assert 'id="export-link"' not in client.get("/messages/").content.decode()
    assert not Activity.objects.filter(action="export").exists()


def test_the_api_export_and_a_metadata_only_exporter(api, exporter, rules):
    make_message(body=f"t {TOKEN}".encode())
    set_privileges(exporter, bodies=False, export=True)
    response = api.as_user(exporter).get("/api/v1/messages/export")
    lines = [json.loads(r) for r in b"".join(response.streaming_content).decode().splitlines()]
    assert lines and all(r["body_base64"] is None and r["body_withheld"] for r in lines)
    assert not Activity.objects.filter(action="body_view").exists()


def test_an_export_past_its_limit_is_refused_with_the_reason(client, exporter, settings):
    settings.EXPORT_MAX_MESSAGES = 2
    for _ in range(3):
        make_message()
    client.force_login(exporter)
    response, _ = _export(client)
    assert response.status_code == 400 and b"more than 2 messages match" in response.content


def test_notifications_are_masked_on_webhook_slack_and_email_text(rules):
    receiver = Receiver()
    try:
        rule = AlertRule.objects.create(name="jobs", kind="replay_job")
        rule.channels.set([webhook(receiver.url)])
        ReplayJob.objects.create(state="paused", state_reason=f"broker said: {TOKEN} refused")
        now = timezone.now()
        assert evaluate(now=now)[rule.pk] == "firing"
        deliver_due(now=now)
        [payload] = receiver.payloads()
    finally:
        receiver.close()
    assert TOKEN not in json.dumps(payload) and "[masked] refused" in payload["items"][0]
    assert TOKEN not in text_of(payload)  # what Slack and email send


def test_alert_pages_and_the_api_show_a_rules_texts_masked(client, api, rules):
    rule = AlertRule.objects.create(name="jobs", kind="replay_job")
    ReplayJob.objects.create(state="paused", state_reason=f"broker said: {TOKEN} refused")
    assert evaluate(now=timezone.now())[rule.pk] == "firing"
    rule.refresh_from_db()
    assert TOKEN in rule.last_items[0]  # stored as it was evaluated
    assert rule.transitions.filter(summary__contains="1").exists()
    rule.transitions.update(summary=f"1 job paused: {TOKEN}")

    viewer = make_user("val", "viewer")
    client.force_login(viewer)
    for page in (client.get("/alerts/"), client.get(f"/alerts/{rule.pk}/")):
        assert page.status_code == 200
        assert TOKEN not in page.content.decode()
    assert "1 job paused: [masked]" in client.get(f"/alerts/{rule.pk}/").content.decode()
    shown = api.as_user(viewer).get(f"/api/v1/alert-rules/{rule.pk}").json()
    assert TOKEN not in json.dumps(shown) and "[masked] refused" in shown["last_items"][0]
    listed = api.as_user(viewer).get("/api/v1/alert-rules").json()
    assert TOKEN not in json.dumps(listed)
    rule.refresh_from_db()
    assert TOKEN in rule.last_items[0]  # showing it masked changed nothing stored


@pytest.mark.parametrize(
    "kind, pattern, error",
    [
        ("regex", "([a-z", "not a valid regular expression"),
        ("json_path", "$.items[", "not a JSON path"),
        ("regex", "x?", "matches the empty text"),
    ],
)
def test_a_bad_rule_is_a_form_error_on_the_page(client, admin_user, kind, pattern, error):
    client.force_login(admin_user)
    response = client.post("/masking/", {"kind": kind, "pattern": pattern})
    assert response.status_code == 400
    assert error in response.content.decode()
    assert not MaskRule.objects.exists()


def test_the_page_says_how_many_recent_messages_each_rule_matches(client, admin_user):
    make_message(body=f"t {TOKEN}".encode(), content_type="text/plain")
    make_message(body=b"nothing")
    client.force_login(admin_user)
    client.post("/masking/", {"kind": "regex", "pattern": "tok_live_[0-9a-f]+"})
    client.post("/masking/", {"kind": "json_path", "pattern": "$.nowhere"})
    used, unused = MaskRule.objects.order_by("id")
    page = client.get("/masking/").content.decode()
    assert "matched 1 of the last 2 messages" in page
    assert "matched 0 of the last 2 messages: it hides nothing yet" in page
    assert Activity.objects.filter(action="mask_rule_created").count() == 2
    assert client.post(f"/masking/{unused.pk}/delete").status_code == 302
    assert list(MaskRule.objects.all()) == [used]


def test_only_admins_manage_masking_rules(client, operator):
    client.force_login(operator)
    assert client.get("/masking/").status_code == 403
    assert client.post("/masking/", {"kind": "header", "pattern": "x"}).status_code == 403
