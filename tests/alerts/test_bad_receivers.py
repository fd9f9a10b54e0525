"""Receivers that misbehave, for real, on local ports (issue #29): each costs its own
notification, never the batch; the healthy channels beside it get each notification exactly
once; a slow one is cut at the send deadline; and delivery never runs inside evaluation."""

import datetime
import socket
import threading
import time
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.db import DatabaseError, connection
from django.utils import timezone

from console.celery import app
from recovery.alerts import deliver
from recovery.alerts.deliver import deliver_due, send_test
from recovery.alerts.tasks import evaluate_alerts
from recovery.models import AlertRule, Notification, NotificationChannel
from tests.helpers import free_port, make_message
from tests.helpers.alerts import Receiver, webhook

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parent.parent.parent
DEADLINE = 1  # seconds: ALERTS_SEND_DEADLINE_SECONDS in these tests
# What a slow receiver may add to the deadline (thread hand-offs, a loaded machine).
SLACK = 1.5


class BadReceiver:
    """A socket server on a local port answering every request as ``kind`` says; ``connections``
    counts the requests it was sent. Every answer stops when the test closes it."""

    def __init__(self, kind, redirect_to=""):
        self.kind, self.redirect_to = kind, redirect_to
        self.connections = 0
        self.stopped = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/hook"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.stopped.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn):
        with conn:
            try:
                conn.settimeout(5)
                conn.recv(65536)  # the request (headers and the small JSON body)
                getattr(self, f"answer_{self.kind}")(conn)
            except OSError:
                pass  # the sender hung up: what a deadline does

    def answer_garbage(self, conn):
        conn.sendall(b"GARBAGE\r\n")

    def answer_slow_headers(self, conn):
        # A header well within any per-read timeout, forever: only a deadline ends it.
        conn.sendall(b"HTTP/1.1 200 OK\r\n")
        for n in range(200):
            if self.stopped.wait(DEADLINE / 5):
                return
            conn.sendall(f"X-Drip-{n}: {n}\r\n".encode())

    def answer_redirect(self, conn):
        conn.sendall(
            f"HTTP/1.1 302 Found\r\nLocation: {self.redirect_to}\r\n"
            "Content-Length: 0\r\n\r\n".encode()
        )

    def answer_status_500(self, conn):
        conn.sendall(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n")

    def answer_timeout(self, conn):
        self.stopped.wait(30)  # accepts, never answers

    def answer_huge_header(self, conn):
        conn.sendall(b"HTTP/1.1 200 OK\r\nX-Huge: " + b"h" * 1_000_000 + b"\r\n\r\n")

    def answer_huge_body(self, conn):
        conn.sendall(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 1000000000\r\n\r\n")
        for _ in range(1000):  # a gigabyte announced, a megabyte at a time
            if self.stopped.is_set():
                return
            conn.sendall(b"b" * 1_000_000)

    def close(self):
        self.stopped.set()
        self.listener.close()


@pytest.fixture
def fast(settings):
    settings.ALERTS_SEND_DEADLINE_SECONDS = DEADLINE
    settings.ALERTS_MAX_ATTEMPTS = 2
    settings.ALERTS_TARGET_ALLOW = []
    return settings


@pytest.fixture
def receivers():
    made = []

    def make(kind=None, **options):
        receiver = BadReceiver(kind, **options) if kind else Receiver()
        made.append(receiver)
        return receiver

    yield make
    for receiver in made:
        receiver.close()


def queue_firing(*channels):
    """What evaluation does when a rule fires: one outbox row per channel."""
    rule = AlertRule.objects.create(name="orders DLQ", kind="open_messages")
    rule.channels.set(channels)
    now = timezone.now()
    rule.queue_notifications("firing", now)
    return now


# kind -> (the target URL given the receiver, what the failed attempt must say)
BAD = {
    "garbage": (None, "BadStatusLine"),
    "slow_headers": (None, "deadline"),
    "redirect": (None, "redirect (to http://localhost:"),
    "status_500": (None, "HTTP 500"),
    "timeout": (None, "deadline"),
    "huge_header": (None, "LineTooLong"),
    "huge_body": (None, "HTTP 500"),
    "refused": (lambda: f"http://127.0.0.1:{free_port()}/nobody", "Connection refused"),
    "space": (lambda: "http://127.0.0.1:9/a hook", "contains a space"),
}


@pytest.mark.parametrize("kind", list(BAD))
def test_it_fails_a_bad_receiver_alone_and_sends_the_others_exactly_once(fast, receivers, kind):
    make_target, reason = BAD[kind]
    # Where a redirect points: another host string on the same machine, counting connections.
    elsewhere = receivers("status_500")
    if make_target:
        target = make_target()
    else:
        target = receivers(kind, redirect_to=f"http://localhost:{elsewhere.port}/stolen").url
    first, last = receivers(), receivers()
    # Queued before and after the bad one, as one rule's batch.
    now = queue_firing(
        webhook(first.url, "a first"), webhook(target, "b bad"), webhook(last.url, "c last")
    )

    for tick in range(4):  # later ticks: the bad one is due again after its backoff
        at = now + datetime.timedelta(hours=tick)
        started = time.monotonic()
        deliver_due(now=at)
        # A slow receiver is cut at the deadline; the others are sent beside it.
        assert time.monotonic() - started < DEADLINE + SLACK

    assert (len(first.requests), len(last.requests)) == (1, 1)
    assert elsewhere.connections == 0  # the signature never went to another host
    failed = Notification.objects.get(channel__name="b bad")
    assert (failed.status, failed.attempts) == ("failed", 2)
    assert reason in failed.last_error and reason in failed.attempt_log[-1]["error"]
    for notification in Notification.objects.exclude(pk=failed.pk):
        assert notification.status == "delivered"
        # The send's own time, not the pass's start.
        assert notification.delivered_at > now


@pytest.mark.parametrize("kind", ["slow_headers", "timeout"])
def test_a_slow_receivers_attempt_ends_at_the_deadline_and_says_when(fast, receivers, kind):
    bad = receivers(kind)
    now = queue_firing(webhook(bad.url))
    started = time.monotonic()
    assert deliver_due(now=now) == {"delivered": 0, "failed": 1}
    took = time.monotonic() - started
    assert DEADLINE - 0.1 < took < DEADLINE + SLACK
    [attempt] = Notification.objects.get().attempt_log
    ended = datetime.datetime.fromisoformat(attempt["at"])
    assert ended - now > datetime.timedelta(seconds=DEADLINE - 0.1)  # when it ended


def test_slow_receivers_are_waited_for_side_by_side(fast, receivers):
    healthy = receivers()
    stalls = [webhook(receivers("timeout").url, f"stall {n}") for n in range(4)]
    now = queue_firing(*stalls, webhook(healthy.url, "z healthy"))
    started = time.monotonic()
    assert deliver_due(now=now) == {"delivered": 1, "failed": 4}
    assert time.monotonic() - started < DEADLINE + SLACK  # not four deadlines one after another
    assert len(healthy.requests) == 1


def test_a_claimed_notification_is_sent_by_one_pass_only(fast, receivers):
    healthy = receivers()
    now = queue_firing(webhook(healthy.url))
    notification = Notification.objects.get()
    # Another pass claimed it a moment ago (its send still running):
    assert notification.claim(timezone.now() + datetime.timedelta(minutes=5))
    assert deliver_due(now=now) == {"delivered": 0, "failed": 0}
    stale = Notification.objects.get()
    stale.next_attempt_at = now  # what a pass that read it before the claim holds
    assert not stale.claim(now + datetime.timedelta(minutes=5))
    assert healthy.requests == []


def test_targets_are_checked_against_the_allow_list_when_sending(fast, receivers):
    healthy = receivers()
    port = healthy.server.server_address[1]
    fast.ALERTS_TARGET_ALLOW = ["10.0.0.0/8", f"127.0.0.1:{port + 1}"]
    refused = send_test(webhook(healthy.url, "outside"))
    assert refused.status == "pending" and healthy.requests == []
    assert "is not in ALERTS_TARGET_ALLOW" in refused.last_error
    for allow, url in (
        (["127.0.0.0/8"], healthy.url),
        ([f"localhost:{port}"], f"http://localhost:{port}/hook"),
        (["relay.example.com", "127.0.0.1"], healthy.url),
    ):
        fast.ALERTS_TARGET_ALLOW = allow
        assert send_test(webhook(url)).status == "delivered", allow
    assert len(healthy.requests) == 3


@pytest.mark.parametrize(
    "target",
    ["ftp://127.0.0.1/hook", "file:///etc/passwd", "http://guest:guest@127.0.0.1:15672/api/"],
)
def test_only_plain_http_targets_are_sent(fast, target):
    notification = send_test(webhook(target))
    assert notification.status == "pending"
    assert "only http and https" in notification.last_error or "credentials" in (
        notification.last_error
    )


def test_send_test_notification_on_a_bad_receiver_is_a_failed_attempt_not_a_500(
    fast, receivers, client, admin_user
):
    channel = webhook(receivers("garbage").url)
    client.force_login(admin_user)
    response = client.post(f"/alerts/channels/{channel.pk}/test")
    assert response.status_code == 302
    notification = Notification.objects.get(channel=channel)
    assert notification.attempts == 1 and "BadStatusLine" in notification.last_error


def test_evaluation_never_waits_for_receivers_and_delivery_has_its_own_queue(fast, receivers):
    stalls = [receivers("timeout") for _ in range(3)]
    rule = AlertRule.objects.create(name="stalled", kind="open_messages", queue="bad-receivers")
    rule.channels.set([webhook(s.url, f"stall {n}") for n, s in enumerate(stalls)])
    make_message(source_queue="bad-receivers")
    started = time.monotonic()
    assert evaluate_alerts() == {str(rule.pk): "firing"}
    assert time.monotonic() - started < DEADLINE  # no receiver was waited for
    assert [s.connections for s in stalls] == [0, 0, 0]
    assert Notification.objects.filter(status="pending").count() == 3

    # Delivery goes to a queue a worker of its own consumes (make run, the Procfile), under
    # the task's name and the one a beat from before #27 still sends; evaluation does not.
    route = app.amqp.router.route
    alerts = django_settings.ALERTS_TASK_QUEUE
    for name in (
        "recovery.alerts.tasks.deliver_notifications",
        "recovery.alert_tasks.deliver_notifications",
    ):
        assert route({}, name)["queue"].name == alerts
    evaluation = route({}, "recovery.alerts.tasks.evaluate_alerts")["queue"].name
    assert evaluation == django_settings.CELERY_TASK_DEFAULT_QUEUE != alerts
    assert f"-Q {alerts} " in (ROOT / "Procfile").read_text()
    assert '-Q "${ALERTS_TASK_QUEUE:-lazarus.alerts}"' in (ROOT / "scripts/run.sh").read_text()


def test_a_channel_gets_its_notifications_in_order(fast, receivers):
    healthy = receivers()
    hook = webhook(healthy.url)
    rule = AlertRule.objects.create(name="flapping", kind="open_messages")
    rule.channels.set([hook])
    now = timezone.now()
    for n, event in enumerate(["firing", "resolved", "firing", "resolved"]):
        rule.queue_notifications(event, now + datetime.timedelta(seconds=n))
    assert deliver_due(now=now + datetime.timedelta(minutes=1)) == {"delivered": 4, "failed": 0}
    assert [p["event"] for p in healthy.payloads()] == ["firing", "resolved"] * 2
    assert NotificationChannel.objects.get().consecutive_failures == 0


def test_a_disabled_channels_outbox_waits_unsent(fast, receivers):
    healthy = receivers()
    hook = webhook(healthy.url)
    now = queue_firing(hook)
    NotificationChannel.objects.filter(pk=hook.pk).update(enabled=False)  # an admin stops it
    assert deliver_due(now=now) == {"delivered": 0, "failed": 0}
    assert healthy.requests == [] and Notification.objects.get().status == "pending"


@pytest.mark.parametrize("deleted", ["rule", "channel"])
def test_a_notification_deleted_while_it_is_sent_is_skipped_and_the_rest_sent_once(
    fast, receivers, monkeypatch, deleted
):
    # As in production, where each statement commits on its own: the test's transaction would
    # otherwise defer the foreign-key checks to a commit that never comes.
    with connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
    first, second, third = receivers(), receivers(), receivers()
    doomed_hook = webhook(first.url, "a doomed")
    doomed_rule = AlertRule.objects.create(name="doomed", kind="open_messages")
    doomed_rule.channels.set([doomed_hook])
    now = timezone.now()
    doomed_rule.queue_notifications("firing", now)
    queue_firing(doomed_hook, webhook(second.url, "b kept"), webhook(third.url, "c kept"))

    real_wait = deliver.wait

    def delete_then_wait(running, **options):
        # An admin deletes it in the console while its send (and the others') runs.
        if deleted == "rule":
            AlertRule.objects.filter(pk=doomed_rule.pk).delete()
        else:
            NotificationChannel.objects.filter(pk=doomed_hook.pk).delete()
        monkeypatch.setattr(deliver, "wait", real_wait)
        return real_wait(running, **options)

    monkeypatch.setattr(deliver, "wait", delete_then_wait)
    for tick in range(3):  # the later ticks are past CLAIM_MARGIN: nothing left claimed
        deliver_due(now=now + datetime.timedelta(hours=tick))

    sent_first = [p["rule"]["name"] for p in first.payloads()]
    # The rule deleted: the channel goes on with the next one; the channel deleted: its
    # queued notification went with it.
    assert sent_first == (["doomed", "orders DLQ"] if deleted == "rule" else ["doomed"])
    assert (len(second.requests), len(third.requests)) == (1, 1)
    assert not Notification.objects.filter(rule=doomed_rule.pk).exists()  # not inserted again
    kept = Notification.objects.exclude(channel=doomed_hook.pk)
    assert [(n.status, n.attempts) for n in kept] == [("delivered", 1), ("delivered", 1)]


def test_after_a_failure_a_channels_later_notification_waits_behind_the_failed_one(fast, receivers):
    healthy = receivers()
    hook = webhook(healthy.url)
    rule = AlertRule.objects.create(name="flapping", kind="open_messages")
    rule.channels.set([hook])
    now = timezone.now()
    rule.queue_notifications("firing", now)
    rule.queue_notifications("resolved", now + datetime.timedelta(seconds=1))

    healthy.down = True  # the first request fails, the rest succeed
    assert deliver_due(now=now + datetime.timedelta(seconds=5)) == {"delivered": 0, "failed": 1}
    healthy.down = False
    # "resolved" is due, "firing" is backing off (30 s): "resolved" waits behind it.
    assert deliver_due(now=now + datetime.timedelta(seconds=15)) == {"delivered": 0, "failed": 0}
    assert deliver_due(now=now + datetime.timedelta(minutes=2)) == {"delivered": 2, "failed": 0}
    assert [p["event"] for p in healthy.payloads()] == ["firing", "firing", "resolved"]


def test_an_outcome_that_cannot_be_recorded_costs_only_its_own_notification(
    fast, receivers, monkeypatch, caplog
):
    first, second = receivers(), receivers()
    now = queue_firing(webhook(first.url, "a unrecordable"), webhook(second.url, "b fine"))
    unrecordable = Notification.objects.get(channel__name="a unrecordable")
    real_record = Notification.record_delivered

    def record_or_fail(notification, at, result):
        if notification.pk == unrecordable.pk:
            raise DatabaseError("the database went away for this one")
        return real_record(notification, at, result)

    monkeypatch.setattr(Notification, "record_delivered", record_or_fail)
    assert deliver_due(now=now) == {"delivered": 2, "failed": 0}
    assert f"could not record the outcome of notification {unrecordable.pk}" in caplog.text
    assert Notification.objects.get(channel__name="b fine").status == "delivered"
    unrecordable.refresh_from_db()  # still claimed: sent again after the claim, as documented
    assert (unrecordable.status, unrecordable.attempts) == ("pending", 0)
    assert unrecordable.next_attempt_at > now + deliver.CLAIM_MARGIN
    assert (len(first.requests), len(second.requests)) == (1, 1)
