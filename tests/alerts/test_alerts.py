"""Alerts end to end with real parts: rules evaluated against the real store and broker,
webhooks received by a real HTTP server (signature checked), email by a real SMTP server."""

import datetime
import hashlib
import hmac
import json

import pika
import pytest
from aiosmtpd.controller import Controller
from django.conf import settings
from django.utils import timezone

from recovery.alerts import engine
from recovery.alerts.checks import Check
from recovery.alerts.deliver import deliver_due, send_test
from recovery.alerts.engine import evaluate
from recovery.broker.management import Management
from recovery.models import (
    AlertRule,
    AuditRun,
    Message,
    Notification,
    NotificationChannel,
    ReplayJob,
    Status,
)
from tests.helpers import free_port, make_message
from tests.helpers.alerts import Receiver, rule, webhook

pytestmark = pytest.mark.django_db


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def test_a_rule_notifies_once_when_it_fires_once_when_it_resolves_and_the_signature_holds(
    receiver,
):
    hook = webhook(receiver.url)
    watched = rule("open_messages", [hook], params={"threshold": 0}, queue="alerts-orders")
    now = timezone.now()
    assert evaluate(now=now)[watched.pk] is None  # nothing open: ok, nothing sent
    message = make_message(source_queue="alerts-orders")
    assert evaluate(now=now + datetime.timedelta(seconds=30))[watched.pk] == "firing"
    assert evaluate(now=now + datetime.timedelta(seconds=60))[watched.pk] is None  # still firing
    assert deliver_due(now=now + datetime.timedelta(seconds=60)) == {"delivered": 1, "failed": 0}

    [sent] = receiver.requests
    body, headers = sent["body"], sent["headers"]
    expected = hmac.new(
        hook.secret.encode(),
        headers["X-Lazarus-Timestamp"].encode() + b"." + body,
        hashlib.sha256,
    ).hexdigest()
    assert headers["X-Lazarus-Signature"] == f"sha256={expected}"
    payload = json.loads(body)
    assert (payload["event"], payload["rule"]["id"], payload["value"]) == ("firing", watched.pk, 1)
    assert payload["rule"]["url"].endswith(f"/alerts/{watched.pk}/")

    Message.objects.filter(pk=message.pk).update(status=Status.DISCARDED)
    assert evaluate(now=now + datetime.timedelta(seconds=90))[watched.pk] == "resolved"
    deliver_due(now=now + datetime.timedelta(seconds=90))
    assert [p["event"] for p in receiver.payloads()] == ["firing", "resolved"]
    watched.refresh_from_db()
    assert [t.state for t in watched.transitions.order_by("at")] == ["firing", "ok"]


def test_a_firing_rule_reminds_at_its_interval_and_a_muted_one_tells_nobody(receiver):
    hook = webhook(receiver.url)
    loud = rule(
        "open_messages",
        [hook],
        name="loud",
        queue="alerts-remind",
        remind_every=datetime.timedelta(minutes=5),
    )
    quiet = rule(
        "open_messages",
        [hook],
        name="quiet",
        queue="alerts-remind",
        muted_until=timezone.now() + datetime.timedelta(hours=1),
    )
    make_message(source_queue="alerts-remind")
    now = timezone.now()
    events = [evaluate(now=now + datetime.timedelta(minutes=m)) for m in (0, 2, 5, 6)]
    assert [e[loud.pk] for e in events] == ["firing", None, "reminder", None]
    assert [e[quiet.pk] for e in events] == ["firing", None, None, None]
    assert Notification.objects.filter(rule=quiet).count() == 0  # muted: history only
    quiet.refresh_from_db()
    assert quiet.state == "firing" and quiet.transitions.count() == 1


def test_a_rule_waits_for_its_condition_to_hold(receiver):
    held = rule("open_messages", [webhook(receiver.url)], queue="alerts-held", for_seconds=60)
    make_message(source_queue="alerts-held")
    now = timezone.now()
    assert evaluate(now=now)[held.pk] is None
    assert evaluate(now=now + datetime.timedelta(seconds=61))[held.pk] == "firing"


def test_the_outbox_retries_with_backoff_until_the_receiver_is_back(receiver):
    receiver.down = True
    hook = webhook(receiver.url)
    rule("open_messages", [hook], queue="alerts-retry")
    make_message(source_queue="alerts-retry")
    now = timezone.now()
    evaluate(now=now)
    for attempt in range(3):  # 503, 503, 503: each retried later, the channel then failing
        assert deliver_due(now=now + datetime.timedelta(hours=attempt)) == {
            "delivered": 0,
            "failed": 1,
        }
    notification = Notification.objects.get(channel=hook)
    assert notification.status == "pending" and notification.attempts == 3
    assert notification.next_attempt_at > now + datetime.timedelta(hours=2)
    assert [a["ok"] for a in notification.attempt_log] == [False, False, False]
    hook.refresh_from_db()
    assert hook.failing and "HTTP 503" in hook.last_error
    receiver.down = False
    assert deliver_due(now=now + datetime.timedelta(hours=4)) == {"delivered": 1, "failed": 0}
    hook.refresh_from_db()
    assert not hook.failing and len(receiver.requests) == 4


def test_a_notification_is_given_up_after_the_attempts_and_says_so():
    dead = webhook(f"http://127.0.0.1:{free_port()}/nobody")  # nothing listens there
    notification = send_test(dead)
    assert notification.status == "pending" and "127.0.0.1" in notification.last_error
    later = timezone.now()
    for _ in range(settings.ALERTS_MAX_ATTEMPTS):
        later += datetime.timedelta(hours=2)
        deliver_due(now=later)
    notification.refresh_from_db()
    assert notification.status == "failed"
    assert notification.attempts == settings.ALERTS_MAX_ATTEMPTS


def test_slack_gets_text_and_email_reaches_a_real_smtp_server(receiver):
    slack = NotificationChannel.objects.create(name="slack", kind="slack", target=receiver.url)
    assert send_test(slack).status == "delivered"
    assert "TEST" in receiver.payloads()[0]["text"]

    received = []

    class Handler:
        async def handle_DATA(self, server, session, envelope):  # noqa: N802 - aiosmtpd's name
            received.append((envelope.rcpt_tos, envelope.content.decode()))
            return "250 OK"

    port = free_port()
    controller = Controller(Handler(), hostname="127.0.0.1", port=port)
    controller.start()
    original = (settings.EMAIL_BACKEND, settings.EMAIL_HOST, settings.EMAIL_PORT)
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", port
    try:
        mail = NotificationChannel.objects.create(
            name="on-call", kind="email", target="oncall@example.com, lead@example.com"
        )
        assert send_test(mail).status == "delivered"
    finally:
        settings.EMAIL_BACKEND, settings.EMAIL_HOST, settings.EMAIL_PORT = original
        controller.stop()
    [(to, content)] = received
    assert sorted(to) == ["lead@example.com", "oncall@example.com"]
    assert "[Lazarus] TEST" in content


def test_a_new_failure_group_fires_and_a_second_one_updates(receiver):
    groups = rule("new_failure_group", [webhook(receiver.url)], queue="alerts-groups")
    make_message(source_queue="alerts-groups", group_key="g-first")
    now = timezone.now()
    assert evaluate(now=now)[groups.pk] == "firing"
    make_message(source_queue="alerts-groups", group_key="g-second")
    assert evaluate(now=now + datetime.timedelta(seconds=30))[groups.pk] == "updated"
    groups.refresh_from_db()
    assert set(groups.last_items) == {"g-first", "g-second"}


def test_a_group_seen_before_the_window_is_not_new_even_if_it_fails_again():
    earlier = timezone.now() - datetime.timedelta(hours=5)
    groups = rule("new_failure_group", queue="alerts-old", params={"window_minutes": 60})
    make_message(source_queue="alerts-old", group_key="g-old", collected_at=earlier)
    make_message(source_queue="alerts-old", group_key="g-old")  # the same failure, again now
    make_message(source_queue="elsewhere", group_key="g-out-of-scope")
    assert evaluate()[groups.pk] is None
    make_message(source_queue="alerts-old", group_key="g-new")
    assert evaluate()[groups.pk] == "firing"
    groups.refresh_from_db()
    assert groups.last_items == ["g-new"]


def test_paused_jobs_and_audits_that_could_not_decide_fire():
    jobs = rule("replay_job")
    audits = rule("audit", params={"missing_after": "00:00"})
    now = timezone.now()
    events = evaluate(now=now)
    assert events[jobs.pk] is None
    assert events[audits.pk] == "firing"  # yesterday's audit never ran: said, not ok
    ReplayJob.objects.create(state="paused", state_reason="canary: 3 of 10 dead again")
    AuditRun.objects.create(
        date=now.date() - datetime.timedelta(days=1),
        status="succeeded",
        totals={"lost": 0},
        warnings=[{"code": "missing_consumer_logs", "count": 2}],
    )
    later = now + datetime.timedelta(seconds=30)
    assert evaluate(now=later)[jobs.pk] == "firing"
    audits.refresh_from_db()
    assert "could not decide: 2 missing_consumer_logs" in audits.last_summary


@pytest.mark.usefixtures("wired")
def test_broker_side_rules_read_the_real_broker():
    idle = rule("queue_without_consumers")
    evaluate()
    idle.refresh_from_db()
    # The test vhost's recovery queues have no collector on them here.
    assert idle.state == "firing"
    assert any(item.endswith(settings.RECOVERY_DEAD_LETTER_QUEUE) for item in idle.last_items)


def test_a_rule_that_cannot_look_is_unknown_until_it_looks_again():
    blind = rule("broker_alarm")
    evaluate(management=Management(url=f"http://guest:guest@127.0.0.1:{free_port()}/api"))
    blind.refresh_from_db()
    assert blind.state == "unknown" and "unreachable" in blind.last_error
    assert [t.state for t in blind.transitions.all()] == ["unknown"]
    evaluate()  # the broker is reachable again
    blind.refresh_from_db()
    assert (blind.state, blind.last_error) == ("ok", "")


@pytest.mark.usefixtures("wired")
def test_uncovered_queues_are_listed_with_the_fix(client, api, viewer):
    connection = pika.BlockingConnection(pika.URLParameters(settings.RABBITMQ_URL))
    channel = connection.channel()
    channel.queue_declare("alerts.naked")
    channel.queue_declare("alerts.covered", arguments={"x-dead-letter-exchange": "recovery.dlx"})
    channel.queue_declare("alerts.elsewhere", arguments={"x-dead-letter-exchange": "other.dlx"})
    channel.exchange_declare("alerts.no-ae", "topic")
    quorum = {"x-queue-type": "quorum", "x-dead-letter-exchange": "recovery.dlx"}
    channel.queue_declare("alerts.quorum-at-most-once", durable=True, arguments=quorum)
    channel.queue_declare(
        "alerts.quorum-at-least-once",
        durable=True,
        arguments={
            **quorum,
            "x-dead-letter-strategy": "at-least-once",
            "x-overflow": "reject-publish",
        },
    )
    try:
        body = api.as_user(viewer).get("/api/v1/uncovered-queues").json()
        found = {(r["kind"], r["name"]): r["problem"] for r in body["results"]}
        assert found[("queue", "alerts.naked")] == "no_dead_letter_exchange"
        assert found[("queue", "alerts.elsewhere")] == "dead_letters_elsewhere"
        assert found[("exchange", "alerts.no-ae")] == "no_alternate_exchange"
        assert ("queue", "alerts.covered") not in found
        assert found[("queue", "alerts.quorum-at-most-once")] == "dead_letters_at_most_once"
        assert ("queue", "alerts.quorum-at-least-once") not in found
        assert not any(name.startswith("recovery.") for _, name in found)
        client.force_login(viewer)
        page = client.get("/uncovered/").content.decode()
        assert "alerts.naked" in page and "manage.py wire" in page
        uncovered_rule = rule("uncovered_queues")
        evaluate()
        uncovered_rule.refresh_from_db()
        assert uncovered_rule.state == "firing"
    finally:
        for queue in (
            "alerts.naked",
            "alerts.covered",
            "alerts.elsewhere",
            "alerts.quorum-at-most-once",
            "alerts.quorum-at-least-once",
        ):
            channel.queue_delete(queue)
        channel.exchange_delete("alerts.no-ae")
        connection.close()


def test_everyone_sees_rules_admins_change_them(client, api, viewer, admin_user, receiver):
    hook = webhook(receiver.url)
    rule("open_messages", [hook], name="orders piling up")
    client.force_login(viewer)
    page = client.get("/alerts/").content.decode()
    assert "orders piling up" in page and receiver.url not in page  # targets: admins only
    assert client.post("/alerts/", {"rule-name": "x", "rule-kind": "audit"}).status_code == 403
    assert client.post(f"/alerts/channels/{hook.pk}/test").status_code == 403

    client.force_login(admin_user)
    response = client.post(
        "/alerts/",
        {
            "rule-name": "DLQ backlog",
            "rule-kind": "collector_lag",
            "rule-params": '{"threshold": 500}',
            "rule-for_seconds": "120",
            "rule-remind_minutes": "30",
            "rule-channels": [str(hook.pk)],
            "rule-enabled": "on",
        },
    )
    assert response.status_code == 302
    created = AlertRule.objects.get(name="DLQ backlog")
    assert (created.params, created.for_seconds) == ({"threshold": 500}, 120)
    assert created.remind_every == datetime.timedelta(minutes=30)
    bad = client.post("/alerts/", {"rule-name": "y", "rule-kind": "audit", "rule-params": "[1]"})
    assert bad.status_code == 200 and "must be a JSON object" in bad.content.decode()
    client.post(f"/alerts/channels/{hook.pk}/test")
    assert receiver.payloads()[-1]["event"] == "test"
    client.post(f"/alerts/{created.pk}/mute", {"minutes": "60"})
    created.refresh_from_db()
    assert created.muted(timezone.now())

    rules = api.as_user(viewer).get("/api/v1/alert-rules").json()["results"]
    assert {r["name"] for r in rules} == {"orders piling up", "DLQ backlog"}
    channels = api.as_user(viewer).get("/api/v1/alert-channels").json()["results"]
    assert channels[0]["target"] is None
    assert api.as_user(admin_user).get("/api/v1/alert-channels").json()["results"][0]["target"] == (
        receiver.url
    )
    denied = api.as_user(viewer).post("/api/v1/alert-rules", {"name": "z", "kind": "audit"})
    assert denied.status_code == 403
    made = api.as_user(admin_user).post(
        "/api/v1/alert-rules",
        {"name": "audit loss", "kind": "audit", "params": {"lost_above": 0}},
    )
    assert made.status_code == 201, made.content
    # Not evaluated yet: unknown, as the console shows it, not a green "ok".
    assert (made.json()["state"], made.json()["unknown_reason"]) == ("unknown", "never evaluated")


def test_an_unchanged_rule_is_still_marked_evaluated_every_cycle():
    quiet = rule("open_messages", params={"threshold": 10**9})
    first = timezone.now()
    evaluate(now=first)
    quiet.refresh_from_db()
    assert quiet.last_evaluated_at == first and quiet.state == "ok"
    later = first + datetime.timedelta(seconds=30)
    evaluate(now=later)  # nothing changed but the time it was looked at
    quiet.refresh_from_db()
    assert quiet.last_evaluated_at == later and quiet.unchecked == ""


def test_a_rule_whose_outcome_cannot_be_saved_is_not_marked_evaluated(monkeypatch, caplog):
    healthy = rule("open_messages", name="healthy", params={"threshold": 10**9})
    broken = rule("open_messages", name="broken", params={"threshold": 10**9})
    period = datetime.timedelta(seconds=settings.ALERTS_EVALUATE_SECONDS)
    first = timezone.now() - 5 * period  # long enough ago to be stale by now
    evaluate(now=first)

    real_check = engine.run_check

    def nul_for_broken(r, now, management):
        if r.pk == broken.pk:
            # PostgreSQL refuses NUL in text: the rule should fire, but its save fails.
            return Check(firing=True, value=1, summary="1 open\u0000")
        return real_check(r, now, management)

    monkeypatch.setattr(engine, "run_check", nul_for_broken)
    now = timezone.now()
    events = evaluate(now=now)

    healthy.refresh_from_db()
    broken.refresh_from_db()
    assert (healthy.last_evaluated_at, healthy.current_state) == (now, "ok")
    # Its row still says "ok" from before; only the stale timestamp keeps that from being shown.
    assert (broken.state, broken.last_evaluated_at) == ("ok", first)
    assert broken.current_state == "unknown"
    assert broken.unknown_reason.startswith("not evaluated since")
    assert f"alert rule {broken.pk}: its evaluation could not be saved" in caplog.text
    # Its "firing" was not queued: not reported as notified either.
    assert healthy.pk in events and broken.pk not in events
