"""Deliver the notification outbox (a beat task every ALERTS_DELIVER_SECONDS, on a queue and a
worker of its own: ALERTS_TASK_QUEUE): webhooks signed with HMAC-SHA256, Slack-compatible
incoming webhooks, email through Django's email settings.

Each due notification is claimed on its own with a conditional UPDATE (``Notification.claim``,
as healthchecks' sendalerts claims a flip), sent outside any transaction, and its outcome
recorded at the time the send ended. Any exception while sending is a failed attempt with its
reason, so one bad receiver costs its own notification, never the batch, and a notification is
sent at most once per attempt. Sends to different channels run side by side (SEND_THREADS);
one channel's notifications go one after another, in the order they were queued: after a
failure the rest of that channel's wait behind the failed one, sent after it once its retry is
due (or it is given up). HTTP sends: ``recovery.alerts.outbound`` (one wall-clock deadline,
no redirects, the allow-list).

A failed attempt is recorded on the notification (``attempt_log``) and retried with backoff
(30 s doubling to an hour) up to ALERTS_MAX_ATTEMPTS, then the notification is ``failed``; a
channel that failed FAILING_AFTER times in a row is shown as failing on the alerts page. That
bookkeeping is on the models (``Notification.record_delivered`` / ``record_failed``); this
module sends.

Webhook signature: ``X-Lazarus-Signature: sha256=<hex HMAC-SHA256(secret, "<ts>.<body>")>`` with
``X-Lazarus-Timestamp: <ts>`` (Unix seconds): a receiver recomputes it over the raw body and
rejects old timestamps, so a captured request cannot be replayed later.
"""

import collections
import datetime
import hashlib
import hmac
import json
import logging
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

from django.conf import settings
from django.core.mail import send_mail
from django.db.models import Exists, OuterRef
from django.utils import timezone

from recovery.alerts.outbound import DeliveryError, post
from recovery.models import Notification, NotificationChannel

__all__ = ["DeliveryError", "deliver_due", "deliver_one", "send", "send_test", "sign"]

log = logging.getLogger(__name__)

# Channels sent to at the same time in one pass: a receiver that takes the whole deadline holds
# one thread, not the others' notifications. More threads cost only idle sockets; the database
# work (claims, outcomes) stays on the task's own thread and connection.
SEND_THREADS = 8

# A claimed notification is not picked up again until this long after the claim (beyond the
# send's deadline): if the worker dies mid-send, a later pass sends it again then (that
# attempt is the one recorded). Email is bounded by EMAIL_TIMEOUT per SMTP step, not by the
# deadline: the operator's own relay, not a receiver anyone can register.
CLAIM_MARGIN = datetime.timedelta(minutes=5)


def sign(secret: str, timestamp: str, body: bytes) -> str:
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def _post(url, body: bytes, headers: dict) -> int:
    try:
        return post(
            url,
            body,
            headers,
            settings.ALERTS_SEND_DEADLINE_SECONDS,
            settings.ALERTS_TARGET_ALLOW,
        )
    except DeliveryError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever the receiver made happen is its failure
        raise DeliveryError(f"{url}: {_reason(exc)}") from exc


def _reason(exc: BaseException) -> str:
    text = str(exc) or repr(exc)
    if isinstance(exc, OSError) and str(exc):  # "[Errno 111] Connection refused", "no answer..."
        return text
    return f"{type(exc).__name__}: {text}"


def text_of(payload: dict) -> str:
    rule = payload["rule"]
    head = {
        "firing": "FIRING",
        "resolved": "RESOLVED",
        "reminder": "STILL FIRING",
        "updated": "FIRING (more)",
        "unknown": "UNKNOWN (cannot check)",
        "test": "TEST",
    }.get(payload["event"], payload["event"].upper())
    lines = [f"[Lazarus] {head}: {rule['name']} — {payload.get('summary') or ''}"]
    lines += [f"  • {item}" for item in (payload.get("items") or [])[:10]]
    lines.append(rule["url"])
    return "\n".join(lines)


def send(channel: NotificationChannel, payload: dict) -> str:
    """Send one payload to one channel; returns a short result; raises DeliveryError."""
    if channel.kind == NotificationChannel.Kind.WEBHOOK:
        body = json.dumps(payload, sort_keys=True).encode()
        ts = str(int(time.time()))
        status = _post(
            channel.target,
            body,
            {"X-Lazarus-Timestamp": ts, "X-Lazarus-Signature": sign(channel.secret, ts, body)},
        )
        return f"HTTP {status}"
    if channel.kind == NotificationChannel.Kind.SLACK:
        body = json.dumps({"text": text_of(payload)}).encode()
        return f"HTTP {_post(channel.target, body, {})}"
    if channel.kind == NotificationChannel.Kind.EMAIL:
        addresses = [a.strip() for a in channel.target.split(",") if a.strip()]
        subject = text_of(payload).splitlines()[0]
        try:
            sent = send_mail(subject, text_of(payload), None, addresses, fail_silently=False)
        except Exception as exc:  # noqa: BLE001 - SMTP, DNS, refused: all are a failed attempt
            raise DeliveryError(f"email to {', '.join(addresses)}: {exc}") from exc
        return f"{sent} email(s)"
    raise DeliveryError(f"unknown channel kind {channel.kind!r}")


def _clock(now=None):
    """The time of each send: the wall clock; with ``now`` given (tests, a pass pinned to a
    time), ``now`` plus the time elapsed since, so an attempt still says when it happened."""
    if now is None:
        return timezone.now
    start = time.monotonic()
    return lambda: now + datetime.timedelta(seconds=time.monotonic() - start)


def _attempt(channel, payload, clock) -> tuple[bool, str, datetime.datetime]:
    """One send, on a sending thread: (ok, result or reason, when it ended). Never raises."""
    try:
        result = send(channel, payload)
    except DeliveryError as exc:
        return False, str(exc), clock()
    except Exception as exc:  # noqa: BLE001 - any exception while sending is a failed attempt
        return False, f"{channel.target}: {_reason(exc)}", clock()
    return True, result, clock()


def _record(notification, outcome) -> bool:
    """Record one send's outcome; returns whether the send worked. A notification deleted
    meanwhile (its rule or channel) is skipped by the model; any other error recording it is
    logged, never raised: it would end the pass and drop the outcomes of the sends still
    running, whose notifications would stay claimed and be sent again after CLAIM_MARGIN."""
    ok, text, at = outcome
    try:
        if ok:
            notification.record_delivered(at, text)
        else:
            notification.record_failed(at, text)
    except Exception:
        # This one is sent again after CLAIM_MARGIN, as if its worker had died mid-send.
        log.exception("could not record the outcome of notification %s", notification.pk)
    return ok


def _claim_until(clock):
    deadline = datetime.timedelta(seconds=settings.ALERTS_SEND_DEADLINE_SECONDS)
    return clock() + deadline + CLAIM_MARGIN


def deliver_one(notification: Notification, now=None) -> bool:
    """One attempt at one notification the caller holds (claimed, or just created claimed);
    the outcome is recorded on it and its channel."""
    return _record(notification, _attempt(notification.channel, notification.payload, _clock(now)))


def _deliver(due: list, clock, counts: dict) -> None:
    """Send ``due`` (oldest first): each claimed just before its send, channels side by side,
    one channel's notifications in order; claims and outcomes on this thread."""
    waiting: dict[int, collections.deque] = {}
    for notification in due:
        waiting.setdefault(notification.channel_id, collections.deque()).append(notification)
    channels = collections.deque(waiting)
    running = {}

    def start(pool, channel_id) -> None:
        queue = waiting[channel_id]
        if not queue:
            return
        notification = queue.popleft()
        if notification.claim(_claim_until(clock)):
            future = pool.submit(_attempt, notification.channel, notification.payload, clock)
            running[future] = notification
        else:
            # Another pass holds this channel's oldest notification: it goes on with the
            # channel, so its notifications still arrive in order.
            queue.clear()

    with ThreadPoolExecutor(max_workers=SEND_THREADS, thread_name_prefix="alerts-send") as pool:
        while channels or running:
            while channels and len(running) < SEND_THREADS:
                start(pool, channels.popleft())
            if not running:
                continue
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                notification = running.pop(future)
                if _record(notification, future.result()):
                    counts["delivered"] += 1
                    start(pool, notification.channel_id)
                else:
                    # The receiver is failing: the channel's later notifications wait for the
                    # next pass instead of each spending a deadline on it now.
                    counts["failed"] += 1


def deliver_due(now=None, limit=100) -> dict:
    """Deliver the notifications that are due; {delivered, failed} counts of this pass."""
    clock = _clock(now)
    cutoff = clock()
    counts = {"delivered": 0, "failed": 0}
    seen: set[int] = set()
    # A channel's notifications go in the order they were queued: one waits while an older one
    # of its channel is pending and not due (backing off after a failure, or claimed by
    # another pass), and each batch is in that order (by id, not by when each is due).
    waits_behind_older = Exists(
        Notification.objects.filter(
            channel=OuterRef("channel"),
            id__lt=OuterRef("id"),
            status=Notification.Status.PENDING,
            next_attempt_at__gt=cutoff,
        )
    )
    while True:
        due = list(
            Notification.objects.select_related("channel")
            .filter(status=Notification.Status.PENDING, next_attempt_at__lte=cutoff)
            .filter(channel__enabled=True)  # a disabled channel's outbox waits, unsent
            .exclude(waits_behind_older)
            .exclude(pk__in=seen)
            .order_by("id")[:limit]
        )
        seen.update(n.pk for n in due)
        _deliver(due, clock, counts)
        if len(due) < limit:
            return counts


def send_test(channel: NotificationChannel, user=None) -> Notification:
    """Queue a test notification to ``channel`` and deliver it now; returns it (its status and
    ``last_error`` say how it went: a bad receiver is a failed attempt, never an exception)."""
    now = timezone.now()
    who = user.get_username() if user else "Lazarus"
    notification = Notification.objects.create(
        channel=channel,
        event="test",
        # Created claimed: a delivery pass running now leaves it to this send.
        next_attempt_at=_claim_until(timezone.now),
        payload={
            "event": "test",
            "at": now.isoformat(),
            "rule": {
                "id": None,
                "name": f"test notification from {who}",
                "kind": "test",
                "scope": {},
                "state": "ok",
                "since": now.isoformat(),
                "url": settings.CONSOLE_BASE_URL.rstrip("/") + "/alerts/",
            },
            "value": None,
            "summary": f"channel {channel.name!r} works",
            "items": [],
        },
    )
    deliver_one(notification)
    return notification
