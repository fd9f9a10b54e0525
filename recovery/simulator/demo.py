"""The demo topology the simulator runs over: three exchanges, one queue per consumer group.

Every queue dead-letters to the recovery DLX (``x-dead-letter-exchange`` argument, so no policy is
needed) and every exchange sends what it cannot route to the recovery alternate exchange. Each
queue is its own consumer group and the group is named after the queue: that is what
``recovery.audit.bindings.broker_bindings`` assumes when it reads bindings from the management
API, so a nightly audit of ``make run`` traffic agrees with the simulator without a hand-written
snapshot.

    <p>.direct  (direct)  payment -> <p>.payments          consumed
                          slow    -> <p>.expiring          no consumer; x-message-ttl (expired)
                          bulk    -> <p>.capped            no consumer; x-max-length (maxlen), ttl
                          full    -> <p>.full              x-max-length 0 + reject-publish (nack)
                          retry   -> <p>.retries           quorum, x-delivery-limit (delivery_limit)
    <p>.topic   (topic)   orders.*.created -> <p>.orders          consumed
                          orders.#         -> <p>.order-history   consumed
    <p>.fanout  (fanout)  -> <p>.billing, <p>.shipping            consumed (two groups)
"""

import dataclasses

import pika.exceptions

REGIONS = ("eu", "us", "ap")


class TopologyError(RuntimeError):
    """The broker already has a demo object declared differently."""


@dataclasses.dataclass(frozen=True)
class DemoQueue:
    name: str
    exchange: str
    binding_key: str  # "#" for the fanout (what the bindings snapshot records)
    arguments: dict
    consumed: bool  # a consumer group runs on it during the simulation
    # Handler failures before the consumer rejects to the DLX. The retries queue lets the broker's
    # delivery limit win instead, so its poison messages die with reason ``delivery_limit``.
    max_attempts: int = 1
    # Bound only halfway through the first round (``--late-binding``): a binding that changes
    # during the day, which the audit must follow (messages before it are not its loss).
    late: bool = False

    @property
    def group(self):
        return self.name


@dataclasses.dataclass(frozen=True)
class DemoTopology:
    prefix: str = "demo"
    ttl_ms: int = 1000  # x-message-ttl of the expiring and capped queues
    capped_length: int = 2  # x-max-length of the capped queue
    delivery_limit: int = 2  # x-delivery-limit of the retries queue
    late_binding: bool = False  # add the fanout's "latecomer" queue, bound mid-round

    @property
    def direct(self):
        return f"{self.prefix}.direct"

    @property
    def topic(self):
        return f"{self.prefix}.topic"

    @property
    def fanout(self):
        return f"{self.prefix}.fanout"

    @property
    def exchanges(self):
        return ((self.direct, "direct"), (self.topic, "topic"), (self.fanout, "fanout"))

    @property
    def missing_queue(self):
        """A default-exchange routing key no queue has: a publish to it is ``basic.return``ed."""
        return f"{self.prefix}.no-such-queue"

    def queue(self, suffix):
        return f"{self.prefix}.{suffix}"

    @property
    def queues(self):
        q = self.queue
        return (
            DemoQueue(q("payments"), self.direct, "payment", {}, consumed=True),
            DemoQueue(q("expiring"), self.direct, "slow", {"x-message-ttl": self.ttl_ms}, False),
            DemoQueue(
                q("capped"),
                self.direct,
                "bulk",
                # drop-head (the default overflow) dead-letters the oldest; the TTL then expires
                # the survivors, so nothing is left behind for the audit to call pending.
                {"x-max-length": self.capped_length, "x-message-ttl": self.ttl_ms},
                consumed=False,
            ),
            DemoQueue(
                q("full"),
                self.direct,
                "full",
                {"x-max-length": 0, "x-overflow": "reject-publish"},
                consumed=False,
            ),
            DemoQueue(
                q("retries"),
                self.direct,
                "retry",
                {"x-queue-type": "quorum", "x-delivery-limit": self.delivery_limit},
                consumed=True,
                max_attempts=1000,
            ),
            DemoQueue(q("orders"), self.topic, "orders.*.created", {}, consumed=True),
            DemoQueue(q("order-history"), self.topic, "orders.#", {}, consumed=True),
            DemoQueue(q("billing"), self.fanout, "#", {}, consumed=True),
            DemoQueue(q("shipping"), self.fanout, "#", {}, consumed=True),
        ) + (
            (DemoQueue(q("latecomer"), self.fanout, "#", {}, consumed=True, late=True),)
            if self.late_binding
            else ()
        )

    def bindings(self, late=False):
        """The bindings the audit reads (``broker_bindings``'s shape): those bound from the
        start, or (``late``) the ones ``bind_late`` adds."""
        return [
            {
                "exchange": queue.exchange,
                "routing_key": queue.binding_key,
                "consumer_group": queue.group,
                "queue": queue.name,
            }
            for queue in self.queues
            if queue.late == late
        ]

    def declare(self, connection, dlx, unrouted):
        """Declare exchanges, queues and bindings; a conflicting existing object is an error."""
        channel = connection.channel()
        try:
            for exchange, kind in self.exchanges:
                channel.exchange_declare(
                    exchange, kind, durable=True, arguments={"alternate-exchange": unrouted}
                )
            for queue in self.queues:
                channel.queue_declare(
                    queue.name,
                    durable=True,
                    arguments={"x-dead-letter-exchange": dlx, **queue.arguments},
                )
                if not queue.late:
                    channel.queue_bind(queue.name, queue.exchange, self.bind_key(queue))
        except pika.exceptions.ChannelClosedByBroker as exc:
            if exc.reply_code == 406:
                raise TopologyError(
                    f"{exc.reply_text}. A demo exchange or queue already exists with other "
                    "arguments (an earlier run with other --ttl-ms/--max-length/--delivery-limit?)"
                    ": delete it, or choose another --prefix."
                ) from exc
            raise
        finally:
            if channel.is_open:
                channel.close()

    def bind_key(self, queue):
        return "" if queue.exchange == self.fanout else queue.binding_key

    def bind_late(self, connection):
        """Bind the late queues; returns when the broker has confirmed (queue.bind-ok)."""
        channel = connection.channel()
        try:
            for queue in self.queues:
                if queue.late:
                    channel.queue_bind(queue.name, queue.exchange, self.bind_key(queue))
        finally:
            if channel.is_open:
                channel.close()


def topic_matches(pattern, key):
    """AMQP topic matching: ``*`` is exactly one word, ``#`` zero or more. Direct keys and the
    fanout's ``#`` are special cases of it."""
    return _match(pattern.split("."), key.split("."))


def _match(words, key):
    if not words:
        return not key
    head, rest = words[0], words[1:]
    if head == "#":
        return any(_match(rest, key[i:]) for i in range(len(key) + 1))
    if not key:
        return False
    return (head in ("*", key[0])) and _match(rest, key[1:])


def expected_groups(bindings, exchange, routing_key, first_ts=None):
    """The groups bound to (exchange, routing key) when the message was first published
    (``first_ts``, epoch ms; a binding's ``from_ms``/``until_ms`` bound it, as in the audit)."""
    return sorted(
        {
            b["consumer_group"]
            for b in bindings
            if b["exchange"] == exchange
            and topic_matches(b["routing_key"], routing_key)
            and (first_ts is None or b.get("from_ms") is None or first_ts >= b["from_ms"])
            and (first_ts is None or b.get("until_ms") is None or first_ts < b["until_ms"])
        }
    )
