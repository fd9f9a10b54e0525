"""Replay one message: put it back on the wire, confirmed, and record what happened.

A message becomes ``replayed`` only once the broker acked the publish (publisher confirms). It is
published ``mandatory``: a ``basic.return`` (nothing bound) or a nack leaves it where it was
(pending) with the reason. Bulk jobs use the same wire format (``recovery.replay.wire``) but
their own asynchronous publisher (recovery.replay.publisher).
"""

import logging

import pika.exceptions
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from recovery.broker.codec import unpublishable
from recovery.broker.confirms import ConfirmingChannel
from recovery.errors import BrokerUnavailable, StateError
from recovery.masking.policy import view_of
from recovery.models import (
    REPLAYABLE,
    Activity,
    Message,
    MessageEdit,
    MessageHistory,
    ReplayAttempt,
    ReplayJobItem,
    Role,
    Scope,
    Status,
)
from recovery.replay.targets import (
    check_may_redirect,
    check_target_scope,
    declare_delay_route,
    delay_route_problem,
    operating_teams,
    validate_target,
)
from recovery.replay.wire import wire_message

log = logging.getLogger(__name__)


class ConfirmingPublisher:
    """The one-click publisher on one vhost: a ``ConfirmingChannel`` whose errors become replay
    outcomes. Context manager."""

    def __init__(self, vhost):
        self.vhost = vhost
        self.confirming = ConfirmingChannel(vhost)

    def __enter__(self):
        self.confirming.open()
        return self

    def __exit__(self, *exc):
        self.confirming.close()

    def publish(self, exchange, routing_key, properties, body):
        """Returns (outcome, detail) with outcome one of ReplayAttempt.Outcome."""
        try:
            self.confirming.publish(exchange, routing_key, body, properties)
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
        except pika.exceptions.ChannelClosedByBroker as exc:
            # e.g. 404 NOT_FOUND: the target exchange does not exist. Nothing was delivered.
            return ReplayAttempt.Outcome.FAILED, f"refused by the broker: {exc.reply_code} " + (
                exc.reply_text
            )
        return ReplayAttempt.Outcome.CONFIRMED, ""


def holding_job(message_id):
    """The id of the job whose runner holds the message right now, or None."""
    return (
        ReplayJobItem.objects.filter(message_id=message_id, state=ReplayJobItem.State.CLAIMED)
        .values_list("job_id", flat=True)
        .first()
    )


def claim(message_id, allowed=REPLAYABLE):
    """Atomically move a message to ``replaying``; None if it is not in an allowed status.

    The returned Message has ``claimed_from``, the status it had before.

    Raises StateError if a bulk job holds it. The row lock comes first: a job claims messages
    under the same lock, so once we hold it the job's claim (if any) is committed and visible.
    """
    with transaction.atomic():
        locked = Message.objects.select_for_update().filter(pk=message_id, status__in=allowed)
        previous = locked.values_list("status", flat=True).first()
        if previous is None:
            return None
        job_id = holding_job(message_id)
        if job_id is not None:
            raise StateError(f"message {message_id} is being replayed by job #{job_id}")
        locked.update(status=Status.REPLAYING, updated_at=timezone.now())
    message = Message.objects.get(pk=message_id)
    message.claimed_from = previous  # the status a failed replay returns it to
    return message


def record_outcome(
    message,
    outcome,
    detail,
    exchange,
    routing_key,
    user=None,
    via="console",
    edited=False,
    previous_status=Status.PENDING,
    edit=None,
    team=None,
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
            user=user,
            exchange=exchange,
            routing_key=routing_key,
            outcome=outcome,
            detail=detail,
            edited=edited,
        )
        activity_detail = {
            "message": message.pk,  # kept when retention deletes the message
            "exchange": exchange,
            "routing_key": routing_key,
            "outcome": outcome,
            "detail": detail,
            "edited": edited,
        }
        if edit is not None:
            edit.attempt = attempt
            edit.save(update_fields=["attempt"])
            activity_detail["edit"] = edit.pk
        action = "edit_replay" if edited else "replay"
        Activity.record(user, action, detail=activity_detail, via=via, message=message, team=team)
        MessageHistory.record_messages(
            [message.pk],
            action,
            user=user,
            via=via,
            outcome=outcome,
            exchange=exchange,
            routing_key=routing_key,
            detail=detail,
        )
    return attempt


def check_caller_may_send(message, target, user, scope=None):
    """ValidationError unless the caller may send ``message`` to ``target``: a team member
    only within a scope of a team they operate for that holds the message; anyone only where
    they may read it in full, unless it goes to its own target (docs/security.md, "Replay
    targets"). No user (the system): no caller to check."""
    if target.is_default or (user is None and scope is None):
        return
    if scope is None:
        scope = Scope.of(user)
    if not scope.has_role(Role.OPERATOR):
        raise ValidationError({target.names()[0]: "replaying needs the operator role"})
    check_target_scope(target, message.vhost, operating_teams(scope, message))
    check_may_redirect(target, view_of(scope, user, message))


def _declare_delay_to_existing(channel, target, final_exchange, vhost):
    """The delay route to ``final_exchange``, declared only when that exchange exists (a
    passive declare first): each made-up name would otherwise leave a quorum queue of its own
    behind, forever. ValidationError when it does not exist (nothing was sent)."""
    if final_exchange:
        try:
            channel.exchange_declare(final_exchange, passive=True)
        except pika.exceptions.ChannelClosedByBroker as exc:
            if exc.reply_code != 404:
                raise
            field = "target_exchange" if target.exchange else "delay_seconds"
            raise ValidationError(
                {
                    field: f"no exchange {final_exchange!r} in vhost {vhost!r}: a delayed "
                    "replay goes only to an exchange that exists"
                }
            ) from None
    declare_delay_route(channel, target.delay_seconds, final_exchange)


def _send(claimed, target, replayed_by, headers, body):
    """Publish one claimed message to its target with confirms; (exchange, routing key it was
    sent for, outcome, detail)."""
    final_exchange, final_key = target.final(
        claimed.kind, claimed.source_queue, claimed.source_exchange, claimed.routing_keys
    )
    publish_exchange, publish_key = target.route(final_exchange, final_key)
    properties, payload = wire_message(claimed, replayed_by, headers, body)
    refused = unpublishable(properties)
    if refused is not None:
        # Sending it would fail the same way every time: a failed attempt with the reason,
        # never "broker unavailable" (which invites retries).
        return final_exchange, final_key, ReplayAttempt.Outcome.FAILED, refused
    if target.delay_seconds:
        problem = delay_route_problem(target.delay_seconds, final_exchange)
        if problem:  # the message's own exchange has a name too long for a delay route
            raise ValidationError({"delay_seconds": problem})
    with ConfirmingPublisher(claimed.vhost) as publisher:
        if target.delay_seconds:
            # On the publishing connection (a channel of its own: a refused declare closes
            # it): RabbitMQ 4.2+'s metadata store (Khepri) confirms a declaration at a
            # majority, and another connection, on another node, may not see it yet.
            channel = publisher.confirming.connection.channel()
            try:
                _declare_delay_to_existing(channel, target, final_exchange, claimed.vhost)
            finally:
                if channel.is_open:
                    channel.close()
        outcome, detail = publisher.publish(publish_exchange, publish_key, properties, payload)
    if target.delay_seconds and outcome == ReplayAttempt.Outcome.CONFIRMED:
        detail = f"delayed {target.delay_seconds}s via {publish_exchange}"
    return final_exchange, final_key, outcome, detail


def replay_message(
    message,
    user=None,
    exchange=None,
    routing_key=None,
    via="console",
    headers=None,
    body=None,
    queue=None,
    delay_seconds=None,
    scope=None,
):
    """Replay one message now (the one-click path). Returns the ReplayAttempt.

    Target: ``queue``, or ``exchange`` + ``routing_key``, or (none given) the message's default
    target; ``delay_seconds`` (one of settings.REPLAY_DELAYS) delays it through a TTL queue.
    ``headers`` (tagged JSON, like Message.headers) and ``body`` (bytes) replace what is sent;
    the stored message is kept and the edit is recorded as a MessageEdit with the user.

    Raises ValidationError (fields target_exchange, target_routing_key, target_queue,
    delay_seconds) for a bad target, one outside the caller's team scopes, a reserved name, a
    delayed replay to an exchange that does not exist, or a target other than the message's own
    for a caller who may not read it in full (``check_caller_may_send``; ``scope``: the caller's,
    None = ``user``'s own); StateError (a ReplayError and a ValidationError) if the
    message is not replayable now (its status, or a job holds it); BrokerUnavailable (a
    ReplayError) if RabbitMQ cannot be reached. In every case nothing was sent and the message is
    left as it was. Properties that cannot go on the wire (``unpublishable``: nested too deep,
    larger than a frame) make a ``failed`` attempt with the reason, and nothing is sent.
    """
    target = validate_target(exchange, routing_key, queue, delay_seconds)
    check_caller_may_send(message, target, user, scope)
    claimed = claim(message.pk)
    if claimed is None:
        current = Message.objects.filter(pk=message.pk).values_list("status", flat=True).first()
        raise StateError(f"message {message.pk} is {current or 'gone'}, not replayable now")
    previous_status = claimed.claimed_from
    try:
        replayed_by = user.get_username() if user is not None else via
        final_exchange, final_key, outcome, detail = _send(
            claimed, target, replayed_by, headers, body
        )
    except (pika.exceptions.AMQPError, OSError) as exc:
        Message.objects.filter(pk=claimed.pk, status=Status.REPLAYING).update(
            status=previous_status, status_reason=f"broker unavailable: {exc!r}"
        )
        raise BrokerUnavailable(f"broker unavailable: {exc!r}") from exc
    except BaseException:
        Message.objects.filter(pk=claimed.pk, status=Status.REPLAYING).update(
            status=previous_status
        )
        raise
    edited = headers is not None or body is not None
    edit = None
    if edited:  # the stored message is kept; what was sent instead is recorded
        edit = MessageEdit.objects.create(
            message=claimed,
            user=user,
            headers=headers,
            body=body,
            via=via,
            exchange=final_exchange,
            routing_key=final_key,
        )
    return record_outcome(
        claimed,
        outcome,
        detail,
        final_exchange,
        final_key,
        user=user,
        via=via,
        edited=edited,
        previous_status=previous_status,
        edit=edit,
        team=scope.acting_team if scope is not None else None,
    )
