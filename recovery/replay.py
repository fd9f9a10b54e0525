"""Replay: put a stored message back on the wire, confirmed, and record what happened.

A message becomes ``replayed`` only once the broker acked the publish (publisher confirms). It is
published ``mandatory``: a ``basic.return`` (nothing bound) leaves it ``pending`` with the reason.
"""

import contextlib
import datetime
import logging

import pika
import pika.exceptions
from django.db import transaction
from django.utils import timezone

from recovery import headers as header_codec
from recovery.broker import connect
from recovery.models import Activity, Message, ReplayAttempt, Status

log = logging.getLogger(__name__)

# Headers describing a previous life of the message; the broker writes fresh ones if it dies again,
# and the store keeps the originals.
STRIPPED_HEADERS = (
    "x-death",
    "x-first-death-queue",
    "x-first-death-reason",
    "x-first-death-exchange",
    "x-last-death-queue",
    "x-last-death-reason",
    "x-last-death-exchange",
    "x-delivery-count",
    "x-recovery-kind",
    "x-recovery-reason",
    "x-recovery-exchange",
    "x-recovery-routing-key",
    "x-recovery-attempts",
    "x-recovery-first-attempt-at",
    "x-recovery-producer",
)


class ReplayError(Exception):
    """The message could not be replayed; the reason is for the operator."""


def wire_message(message, replayed_by="", headers_override=None, body_override=None):
    """(properties, body) to publish for a stored message.

    ``expiration`` is dropped: a per-message TTL that killed it once would kill it again.
    """
    props = {
        name: header_codec.from_json(value)
        for name, value in message.properties.items()
        if name != "expiration"
    }
    if headers_override is not None:
        headers = header_codec.headers_from_json(headers_override)
    else:
        headers = message.wire_headers
    for name in STRIPPED_HEADERS:
        headers.pop(name, None)
    headers["x-recovery-replay-count"] = message.replay_count + 1
    headers["x-recovery-replayed-at"] = datetime.datetime.now(datetime.UTC).replace(tzinfo=None)
    headers["x-recovery-replayed-by"] = replayed_by or "lazarus"
    headers["x-recovery-origin"] = message.pk
    body = message.body_bytes if body_override is None else body_override
    return pika.BasicProperties(headers=headers, **props), body


class Publisher:
    """A confirming, mandatory publisher on one vhost. Use as a context manager."""

    def __init__(self, vhost):
        self.vhost = vhost
        self.connection = None
        self.channel = None

    def __enter__(self):
        self.connection = connect(self.vhost)
        self.channel = self.connection.channel()
        self.channel.confirm_delivery()
        return self

    def __exit__(self, *exc):
        if self.connection is not None and self.connection.is_open:
            with contextlib.suppress(pika.exceptions.AMQPError):
                self.connection.close()

    def publish(self, exchange, routing_key, properties, body):
        """Returns (outcome, detail) with outcome one of ReplayAttempt.Outcome."""
        try:
            self.channel.basic_publish(exchange, routing_key, body, properties, mandatory=True)
        except pika.exceptions.UnroutableError as exc:
            returned = exc.messages[0].method if exc.messages else None
            detail = (
                f"returned by the broker: {returned.reply_code} {returned.reply_text}"
                if returned
                else "returned by the broker"
            )
            return ReplayAttempt.Outcome.RETURNED, detail
        except pika.exceptions.NackError:
            return ReplayAttempt.Outcome.NACKED, "the broker nacked the publish"
        return ReplayAttempt.Outcome.CONFIRMED, ""


def claim(message_id, allowed=(Status.PENDING, Status.POISONED, Status.REPLAYED)):
    """Atomically move a message to ``replaying``; None if another replay holds it or it is gone."""
    updated = Message.objects.filter(pk=message_id, status__in=allowed).update(
        status=Status.REPLAYING, updated_at=timezone.now()
    )
    return Message.objects.get(pk=message_id) if updated else None


def record_outcome(
    message,
    outcome,
    detail,
    exchange,
    routing_key,
    user=None,
    job=None,
    via="console",
    edited=False,
    previous_status=Status.PENDING,
):
    now = timezone.now()
    with transaction.atomic():
        if outcome == ReplayAttempt.Outcome.CONFIRMED:
            Message.objects.filter(pk=message.pk).update(
                status=Status.REPLAYED,
                status_reason="",
                replay_count=message.replay_count + 1,
                last_replayed_at=now,
                updated_at=now,
            )
        else:
            # Back to where it was (pending/poisoned), with the reason the operator will see.
            Message.objects.filter(pk=message.pk).update(
                status=previous_status if previous_status != Status.REPLAYED else Status.PENDING,
                status_reason=detail,
                updated_at=now,
            )
        attempt = ReplayAttempt.objects.create(
            message=message,
            job=job,
            user=user,
            exchange=exchange,
            routing_key=routing_key,
            outcome=outcome,
            detail=detail,
            edited=edited,
        )
        Activity.objects.create(
            user=user,
            action="replay",
            message=message,
            job=job,
            via=via,
            detail={
                "exchange": exchange,
                "routing_key": routing_key,
                "outcome": outcome,
                "detail": detail,
                "edited": edited,
            },
        )
    return attempt


def replay_message(
    message, user=None, exchange=None, routing_key=None, via="console", headers=None, body=None
):
    """Replay one message now (the one-click path). Returns the ReplayAttempt.

    Raises ReplayError if the message is not in a replayable state or the broker is unreachable
    (then the message is left as it was).
    """
    previous_status = message.status
    claimed = claim(message.pk)
    if claimed is None:
        raise ReplayError(f"message {message.pk} is {message.status}, not replayable now")
    if exchange is None and routing_key is None:
        exchange, routing_key = claimed.default_target()
    exchange, routing_key = exchange or "", routing_key or ""
    replayed_by = user.get_username() if user is not None else via
    properties, payload = wire_message(claimed, replayed_by, headers, body)
    try:
        with Publisher(claimed.vhost) as publisher:
            outcome, detail = publisher.publish(exchange, routing_key, properties, payload)
    except (pika.exceptions.AMQPError, OSError) as exc:
        Message.objects.filter(pk=claimed.pk, status=Status.REPLAYING).update(
            status=previous_status, status_reason=f"broker unavailable: {exc!r}"
        )
        raise ReplayError(f"broker unavailable: {exc!r}") from exc
    return record_outcome(
        claimed,
        outcome,
        detail,
        exchange,
        routing_key,
        user=user,
        via=via,
        edited=headers is not None or body is not None,
        previous_status=previous_status,
    )
