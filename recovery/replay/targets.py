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

from recovery.models import Role, Scope, default_target_of
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

    @property
    def is_default(self):
        """Each message's own target (a delay alone keeps it)."""
        return self.queue is None and self.exchange is None

    def names(self):
        """(field, queue, exchange) an operator named: the queue (the default exchange's
        routing key is one), or the exchange; None for the default target."""
        if self.queue:
            return "target_queue", self.queue, ""
        if self.exchange == "":
            return "target_routing_key", self.routing_key or "", ""
        if self.exchange is not None:
            return "target_exchange", "", self.exchange
        return None

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
# The broker's own exchanges (amq.direct, amq.rabbitmq.trace...) and server-named queues
# (amq.gen-...), and Lazarus's own names: never an operator's target (see reserved_name).
RESERVED_PREFIXES = ("amq.", "recovery.")


def reserved_name(name):
    """Whether ``name`` (an exchange or a queue) is the broker's or Lazarus's own.

    A publish to ``recovery.dlx`` or a recovery queue is stored by the collector as a new dead
    letter, with whatever ``x-original-*`` or ``x-recovery-*`` headers an edit put there: a
    forged failure in any team's list. The delay routes are Lazarus's too (the runner declares
    them itself). The configured names count as well as the defaults (settings may rename them).
    """
    from recovery.broker.topology import Names

    names = Names.from_settings()
    own = {*names.source_queues, names.dlx, names.quarantine, settings.REPLAY_DELAY_PREFIX}
    prefixes = (*RESERVED_PREFIXES, f"{settings.REPLAY_DELAY_PREFIX}.")
    return name in own or name.startswith(prefixes)


def _name_problem(value, *, name=True):
    """Why ``value`` cannot be an AMQP name (a shortstr PostgreSQL can store), or None."""
    text = str(value)
    if len(text.encode()) > AMQP_NAME_LIMIT:
        return f"at most {AMQP_NAME_LIMIT} bytes"
    if "\x00" in text or (name and any(ord(c) < 32 or ord(c) == 127 for c in text)):
        return "control characters are not allowed"
    return None


def _reserved_problem(exchange, routing_key, queue):
    """(field, why) when the target names a reserved exchange or queue, else None. The default
    exchange's routing key is a queue name."""
    if queue and reserved_name(queue):
        return "target_queue", queue
    if exchange and reserved_name(exchange):
        return "target_exchange", exchange
    if exchange is not None and not exchange and routing_key and reserved_name(routing_key):
        return "target_routing_key", routing_key
    if exchange is None and routing_key and reserved_name(routing_key):
        return "target_routing_key", routing_key
    return None


def _delay_problem(delay_seconds):
    allowed = settings.REPLAY_DELAYS
    if isinstance(delay_seconds, bool) or not isinstance(delay_seconds, int):
        return "a whole number of seconds"
    if delay_seconds not in allowed:
        return (
            f"{delay_seconds} s is not a configured delay; choose one of "
            f"{', '.join(str(d) for d in allowed)} (setting REPLAY_DELAYS)"
        )
    return None


def delay_route_problem(seconds, final_exchange):
    """Why no delay route can lead to ``final_exchange``, or None: its name
    (``recovery.delay.10s.to.<exchange>``) must fit a shortstr too, or the broker drops the
    connection (which looked like "broker unavailable")."""
    name = delay_name(seconds, final_exchange)
    if len(name.encode()) > AMQP_NAME_LIMIT:
        room = AMQP_NAME_LIMIT - len(delay_name(seconds, "x").encode()) + 1
        return f"with a delay of {seconds} s an exchange name may be at most {room} bytes"
    return None


def validate_target(exchange=None, routing_key=None, queue=None, delay_seconds=None):
    """A checked Target; ValidationError naming the field on bad input.

    A routing key without an exchange means the default exchange (AMQP: key = queue name).
    Who may send where is checked apart (``check_target_scope``); these rules hold for everyone,
    admins included.
    """
    errors = {}
    for field, value in (("target_exchange", exchange), ("target_routing_key", routing_key)):
        problem = value is not None and _name_problem(value, name=field == "target_exchange")
        if problem:
            errors[field] = problem
    if queue is not None:
        if not str(queue).strip():
            errors["target_queue"] = "a queue name cannot be empty"
        elif _name_problem(queue):
            errors["target_queue"] = _name_problem(queue)
        elif names_queue_and_exchange(queue, exchange, routing_key):
            errors["target_queue"] = QUEUE_OR_EXCHANGE
    if delay_seconds is not None and _delay_problem(delay_seconds):
        errors["delay_seconds"] = _delay_problem(delay_seconds)
    if not errors:
        reserved = _reserved_problem(exchange, routing_key, queue)
        if reserved is not None:
            field, name = reserved
            errors[field] = f"{name} is the broker's or Lazarus's own, not a replay target"
        elif exchange and delay_seconds and delay_route_problem(delay_seconds, exchange):
            errors["target_exchange"] = delay_route_problem(delay_seconds, exchange)
    if errors:
        raise ValidationError(errors)
    if exchange is None and routing_key is not None:
        exchange = ""
    return Target(exchange, routing_key, queue or None, delay_seconds or None)


# ---- who may send where ---------------------------------------------------------------------


def operating_teams(scope, message):
    """The teams ``scope`` operates for whose scopes hold ``message`` (None: a global caller).

    A team member's target must lie in one of these: in a scope of the same team as the
    message, so a copy that dies there is stored under that team's masking rules (a copy dying
    in another team's queue would be read there unmasked, docs/security.md)."""
    if scope.is_global:
        return None
    return [
        team
        for team in scope.team_ids(Role.OPERATOR)
        if any(
            s.matches(message.vhost, message.source_queue, message.source_exchange)
            for s in scope.scopes.get(team, [])
        )
    ]


def target_in_teams(target, vhost, team_ids):
    """Whether ``target`` (not the default one) lies in a scope of ``vhost`` of one of the
    teams: a queue (or the default exchange's key) matched by a queue pattern, an exchange by an
    exchange pattern. ``team_ids`` None: a global caller, anywhere (reserved names aside)."""
    named = target.names()
    if named is None or team_ids is None:
        return True
    _field, queue, exchange = named
    return any(Scope.covers(team, vhost, queue, exchange) for team in team_ids)


def check_target_scope(target, vhost, team_ids):
    """ValidationError (naming the target's field) unless ``target_in_teams``. The same answer
    whether the name exists, belongs to another team or to no one: nothing about other teams'
    names leaks."""
    if not target_in_teams(target, vhost, team_ids):
        field = target.names()[0]
        raise ValidationError({field: f"not in your team's scopes (vhost {vhost})"})


# What a caller who may not read a message in full is told when they name a target.
NEEDS_FULL_READ = (
    "you may not read this message in full (masked, or metadata only): it may be replayed "
    "only to its own target unless you hold the unmask privilege"
)


def may_redirect(view):
    """Whether a caller with ``view`` (recovery.models.masking.View) of a message may send it
    somewhere other than its own target: a replay puts the stored bytes, unmasked, where the
    target's readers (maybe the caller, through a queue they consume) read them. So only a
    caller who may read them: bodies, and no masks or the privilege to lift them."""
    return view.bodies and (not view.masked or view.may_unmask)


def check_may_redirect(target, view):
    if not target.is_default and not may_redirect(view):
        raise ValidationError({target.names()[0]: NEEDS_FULL_READ})
