"""Deliver the notification outbox (a beat task every ALERTS_DELIVER_SECONDS): webhooks signed
with HMAC-SHA256, Slack-compatible incoming webhooks, email through Django's email settings.

A failed attempt is recorded on the notification (``attempt_log``) and retried with backoff
(30 s doubling to an hour) up to ALERTS_MAX_ATTEMPTS, then the notification is ``failed``; a
channel that failed FAILING_AFTER times in a row is shown as failing on the alerts page. That
bookkeeping is on the models (``Notification.record_delivered`` / ``record_failed``); this
module sends.

Webhook signature: ``X-Lazarus-Signature: sha256=<hex HMAC-SHA256(secret, "<ts>.<body>")>`` with
``X-Lazarus-Timestamp: <ts>`` (Unix seconds): a receiver recomputes it over the raw body and
rejects old timestamps, so a captured request cannot be replayed later.
"""

import hashlib
import hmac
import json
import time
import urllib.error
import urllib.request

from django.conf import settings
from django.core.mail import send_mail
from django.db import transaction
from django.utils import timezone

from recovery.models import Notification, NotificationChannel


class DeliveryError(Exception):
    pass


def sign(secret: str, timestamp: str, body: bytes) -> str:
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def _post(url, body: bytes, headers: dict) -> int:
    request = urllib.request.Request(url, data=body, method="POST")
    for name, value in {"Content-Type": "application/json", **headers}.items():
        request.add_header(name, value)
    try:
        with urllib.request.urlopen(request, timeout=settings.ALERTS_HTTP_TIMEOUT_SECONDS) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        raise DeliveryError(f"HTTP {exc.code} from {url}") from exc
    except (urllib.error.URLError, OSError) as exc:
        raise DeliveryError(f"{url}: {exc}") from exc


def text_of(payload: dict) -> str:
    rule = payload["rule"]
    head = {
        "firing": "FIRING",
        "resolved": "RESOLVED",
        "reminder": "STILL FIRING",
        "updated": "FIRING (more)",
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


def deliver_one(notification: Notification, now=None) -> bool:
    """One attempt at one notification; the outcome is recorded on it and its channel."""
    now = now or timezone.now()
    try:
        result = send(notification.channel, notification.payload)
    except DeliveryError as exc:
        notification.record_failed(now, str(exc))
        return False
    notification.record_delivered(now, result)
    return True


def deliver_due(now=None, limit=100) -> dict:
    """Deliver the notifications that are due; {delivered, failed} counts of this pass."""
    now = now or timezone.now()
    counts = {"delivered": 0, "failed": 0}
    while True:
        with transaction.atomic():
            batch = list(
                Notification.objects.select_for_update(skip_locked=True)
                .select_related("channel")
                .filter(status=Notification.Status.PENDING, next_attempt_at__lte=now)
                .order_by("next_attempt_at", "id")[:limit]
            )
            for notification in batch:
                counts["delivered" if deliver_one(notification, now) else "failed"] += 1
        if len(batch) < limit:
            return counts


def send_test(channel: NotificationChannel, user=None) -> Notification:
    """Queue a test notification to ``channel`` and deliver it now; returns it."""
    now = timezone.now()
    who = user.get_username() if user else "Lazarus"
    notification = Notification.objects.create(
        channel=channel,
        event="test",
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
    deliver_one(notification, now)
    return notification
