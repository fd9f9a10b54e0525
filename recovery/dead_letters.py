"""What a dead letter's headers say: the names the broker, consumer frameworks and our client
write, and the few pure readings of them (no Django, no models).

The collector reads them into a store row, the replay strips them before publishing again,
masking and the counts read the exception a framework named, the quarantine drops the
per-delivery ones. Each name is written here once.
"""

import functools
import re

# The broker's own account of each death: x-death (one entry per queue and reason, most recent
# first) and, since 3.13, the first and the last death at the top level.
X_DEATH = "x-death"
FIRST_DEATH_HEADERS = ("x-first-death-queue", "x-first-death-reason", "x-first-death-exchange")
LAST_DEATH_HEADERS = ("x-last-death-queue", "x-last-death-reason", "x-last-death-exchange")

# Headers the broker sets on each delivery from *our* recovery queue, overwriting any the message
# carried: quorum queues put their x-delivery-count on a redelivery (3.x: every return; 4.3:
# failed ones), and from 4.3 x-acquired-count (every time a consumer was given it). 4.x turns
# every x- annotation of a delivery into a header (mc_amqpl:protocol_state); for a quorum queue
# those two are the per-delivery ones. They describe our queue, not the message, and differ
# between a delivery and its redelivery, so they are neither stored nor part of the fingerprint
# (and a replay strips them).
DELIVERY_SCOPED_HEADERS = ("x-delivery-count", "x-acquired-count")

# What the client library (recovery/client/publisher.py) writes on a message it hands over after
# a basic.return, a nack or no confirm: which of them, why, where it was going, how often it
# was tried. The client is distributed on its own and spells them itself; these are the same.
HANDOVER_HEADERS = (
    "x-recovery-kind",
    "x-recovery-reason",
    "x-recovery-exchange",
    "x-recovery-routing-key",
    "x-recovery-attempts",
    "x-recovery-first-attempt-at",
    "x-recovery-producer",
)
HANDOVER_DETAIL = "x-recovery-detail"

# What a replay writes (recovery/replay/wire.py) and the collector reads back when the copy
# dies again.
REPLAY_COUNT = "x-recovery-replay-count"
REPLAYED_AT = "x-recovery-replayed-at"
REPLAYED_BY = "x-recovery-replayed-by"
REPLAY_ORIGIN = "x-recovery-origin"

# Headers describing a previous life of the message: the broker writes fresh ones if it dies
# again, and the store keeps the originals, so a replay publishes without them.
PREVIOUS_LIFE_HEADERS = (
    X_DEATH,
    *FIRST_DEATH_HEADERS,
    *LAST_DEATH_HEADERS,
    *DELIVERY_SCOPED_HEADERS,
    *HANDOVER_HEADERS,
)

# Headers frameworks use to say why a consumer gave up (Spring AMQP, our client, common custom).
# An AMQP 1.0 consumer (RabbitMQ 4.0+) that settles with `modified` and `undeliverable-here`
# dead-letters with its own message annotations, which reach us as headers: RabbitMQ's docs
# show x-opt-dead-letter-reason (a sentence) and x-opt-dead-letter-category.
EXCEPTION_TYPE_HEADERS = (
    "x-exception-type",
    "x-exception-class",
    "exception-type",
    "x-opt-dead-letter-category",
)
EXCEPTION_MESSAGE_HEADERS = (
    "x-exception-message",
    "x-exception",
    "exception-message",
    HANDOVER_DETAIL,
    "x-opt-dead-letter-reason",
)


def header_text(value, limit=None):
    """A header or property value as database text (PostgreSQL text cannot hold NUL)."""
    if type(value) is str and "\x00" not in value:
        return value[:limit] if limit else value
    if value is None:
        return ""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    elif not isinstance(value, str):
        value = str(value)
    if "\x00" in value:
        value = value.replace("\x00", "")
    return value[:limit] if limit else value


def first_header(headers, names):
    """The first of ``names`` these headers carry, as text ('' if none)."""
    for name in names:
        if name in headers:
            return header_text(headers[name])
    return ""


def exception_type(headers):
    """The exception type a consumer framework named in these headers ('' if none)."""
    return first_header(headers, EXCEPTION_TYPE_HEADERS)


def exception_message(headers):
    """The exception message a consumer framework named in these headers ('' if none)."""
    return first_header(headers, EXCEPTION_MESSAGE_HEADERS)


_NUMBERS = re.compile(r"\d+")


@functools.lru_cache(maxsize=4096)
def label_message(exc_message):
    """An exception message as a group label holds it: the first line, cut, numbers as ``#``
    (ids and counts inside it would make every message its own group)."""
    return _NUMBERS.sub("#", exc_message.splitlines()[0] if exc_message else "")[:200]
