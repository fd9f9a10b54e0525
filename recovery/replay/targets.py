"""Where a replayed message goes (docs/design.md "Replay semantics") and the delayed-retry topology.

A target is one of: each message's default (a dead letter goes back to the queue it died in
through the default exchange, never re-fanned; unroutable and returned messages to their
original exchange and routing key), a queue, or an exchange + routing key. Any of them may be
delayed: the message is published to a TTL queue that dead-letters it to the target when the
TTL expires (the seeds' delayed queues).

A delay route is a fanout exchange and a quorum queue of the same name, ``recovery.delay.10s``
(final exchange = the default exchange) or ``recovery.delay.10s.to.<exchange>``. The message is
published to that exchange *with its final routing key*; the queue keeps the key and, on
expiry, dead-letters the message to the final exchange with it. Dead-lettering is
``at-least-once`` (the queue retries until the target takes the message), so an unroutable
final target leaves messages visible in the delay queue rather than dropping them.
"""

from dataclasses import dataclass

from django.conf import settings
from django.core.exceptions import ValidationError

from recovery.models import default_target_of
from recovery.replay.options import QUEUE_OR_EXCHANGE, names_queue_and_exchange


@dataclass(frozen=True)
class Target:
    """What an operator chose; all None = each message's default target."""

    exchange: str | None = None
    routing_key: str | None = None
    queue: str | None = None
    delay_seconds: int | None = None

    @classmethod
    def of_job(cls, job):
        return cls(job.target_exchange, job.target_routing_key, job.target_queue, job.delay_seconds)

    def final(self, kind, source_queue, source_exchange, routing_keys):
        """(exchange, routing_key) the message finally arrives at."""
        if self.queue:
            return "", self.queue
        if self.exchange is not None:
            return self.exchange, self.routing_key or ""
        return default_target_of(kind, source_queue, source_exchange, routing_keys)

    def route(self, final_exchange, final_routing_key):
        """(exchange, routing_key) to publish to: the final one, or its delay route."""
        if not self.delay_seconds:
            return final_exchange, final_routing_key
        return delay_name(self.delay_seconds, final_exchange), final_routing_key


def delay_label(seconds):
    """10 -> 10s, 60 -> 1m, 600 -> 10m, 3600 -> 1h, 90 -> 90s."""
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def delay_name(seconds, final_exchange=""):
    name = f"{settings.REPLAY_DELAY_PREFIX}.{delay_label(seconds)}"
    return f"{name}.to.{final_exchange}" if final_exchange else name


def delay_queue_arguments(seconds, final_exchange=""):
    """The arguments of the TTL queue that delays messages for ``final_exchange``."""
    return {
        "x-queue-type": "quorum",
        "x-message-ttl": int(seconds * 1000),
        "x-dead-letter-exchange": final_exchange,
        # at-least-once dead-lettering needs reject-publish: a full delay queue refuses
        # (nacks) new messages instead of dropping its oldest ones.
        "x-dead-letter-strategy": "at-least-once",
        "x-overflow": "reject-publish",
    }


def declare_delay_route(channel, seconds, final_exchange=""):
    """Declare (idempotently) the exchange + TTL queue delaying messages for ``final_exchange``
    on a blocking channel (the one-click path; a bulk job's publisher declares its routes on its
    own channel, recovery.replay.publisher.AsyncPublisher.want_route)."""
    name = delay_name(seconds, final_exchange)
    channel.exchange_declare(name, "fanout", durable=True)
    channel.queue_declare(
        name, durable=True, arguments=delay_queue_arguments(seconds, final_exchange)
    )
    channel.queue_bind(name, name)
    return name


AMQP_NAME_LIMIT = 255  # shortstr: exchange, queue and routing key names are at most 255 bytes


def validate_target(exchange=None, routing_key=None, queue=None, delay_seconds=None):
    """A checked Target; ValidationError naming the field on bad input.

    A routing key without an exchange means the default exchange (AMQP: key = queue name).
    """
    errors = {}
    for field, value in (("target_exchange", exchange), ("target_routing_key", routing_key)):
        if value is not None and len(str(value).encode()) > AMQP_NAME_LIMIT:
            errors[field] = f"at most {AMQP_NAME_LIMIT} bytes"
    if queue is not None:
        if not str(queue).strip():
            errors["target_queue"] = "a queue name cannot be empty"
        elif len(str(queue).encode()) > AMQP_NAME_LIMIT:
            errors["target_queue"] = f"at most {AMQP_NAME_LIMIT} bytes"
        elif names_queue_and_exchange(queue, exchange, routing_key):
            errors["target_queue"] = QUEUE_OR_EXCHANGE
    if delay_seconds is not None:
        allowed = settings.REPLAY_DELAYS
        if isinstance(delay_seconds, bool) or not isinstance(delay_seconds, int):
            errors["delay_seconds"] = "a whole number of seconds"
        elif delay_seconds not in allowed:
            errors["delay_seconds"] = (
                f"{delay_seconds} s is not a configured delay; choose one of "
                f"{', '.join(str(d) for d in allowed)} (setting REPLAY_DELAYS)"
            )
    if errors:
        raise ValidationError(errors)
    if exchange is None and routing_key is not None:
        exchange = ""
    return Target(exchange, routing_key, queue or None, delay_seconds or None)
