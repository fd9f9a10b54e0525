"""The seeded plan of one simulator round: where each message goes and which fault it meets.

Pure: the same seed, round and settings always give the same plan (routes, faults, bodies,
drop points), so a run can be repeated exactly. What the broker then does nondeterministically —
resends after a dropped connection, redeliveries — is observed, not planned (``observe.py``).
"""

import dataclasses
import json
import random

import pika

from recovery.simulator.demo import REGIONS

# Faults a message can be planned to meet; a message meets at most one ("none" = none).
FAULTS = ("reject", "ttl", "overflow", "unroutable", "returned", "nack", "poison", "crash")
# The ones a consumer group acts out, so they name the group that does it.
CONSUMER_FAULTS = ("reject", "crash")


@dataclasses.dataclass(frozen=True)
class Rates:
    """Share of the messages planned to meet each fault (0..1 each, at most 1 together)."""

    reject: float = 0.05  # a consumer group rejects it -> DLX (rejected)
    ttl: float = 0.05  # sent to a queue nobody consumes, with a TTL -> DLX (expired)
    overflow: float = 0.05  # sent in one burst to a capped queue -> DLX (maxlen), rest expire
    unroutable: float = 0.05  # a routing key nothing binds -> alternate exchange
    returned: float = 0.02  # to a queue that does not exist, mandatory -> basic.return
    nack: float = 0.02  # to a queue that refuses it -> nack, retried, handed to Lazarus
    poison: float = 0.02  # the handler always fails and requeues -> DLX (delivery_limit)
    crash: float = 0.02  # the consumer crashes after handling, before the ack -> redelivered

    def __post_init__(self):
        for name, value in dataclasses.asdict(self).items():
            if not 0 <= value <= 1:
                raise ValueError(f"fault rate {name}={value} is not between 0 and 1")
        if sum(dataclasses.asdict(self).values()) > 1 + 1e-9:
            raise ValueError("fault rates add up to more than 1")

    def choose(self, rng):
        roll = rng.random()
        for name, value in dataclasses.asdict(self).items():
            if roll < value:
                return name
            roll -= value
        return "none"


@dataclasses.dataclass(frozen=True)
class PlannedMessage:
    index: int
    message_id: str
    fault: str
    exchange: str
    routing_key: str
    target_group: str | None  # the consumer group that rejects it / crashes on it
    expiration_ms: int | None  # per-message TTL
    producer: int  # which of the round's publishers sends it

    def fault_for(self, group):
        """What ``group``'s handler must do with this message: reject, crash, poison or None."""
        if self.fault == "poison":
            return "poison"
        if self.fault in CONSUMER_FAULTS and self.target_group == group:
            return self.fault
        return None

    def body(self):
        return json.dumps(
            {
                "n": self.index,
                "fault": self.fault,
                "group": self.target_group,
                "amount": f"{(self.index * 7919) % 100000 / 100:.2f}",
            },
            separators=(",", ":"),
        ).encode()

    def properties(self):
        return pika.BasicProperties(
            message_id=self.message_id,
            content_type="application/json",
            delivery_mode=2,
            headers={"x-simulated-fault": self.fault},
            expiration=str(self.expiration_ms) if self.expiration_ms is not None else None,
        )


def consumed_routes(topology):
    """(exchange, routing_key template, groups) of the routes consumer groups read."""
    return (
        (topology.direct, "payment", (topology.queue("payments"),)),
        (
            topology.topic,
            "orders.{region}.created",
            (topology.queue("orders"), topology.queue("order-history")),
        ),
        (topology.topic, "orders.{region}.shipped", (topology.queue("order-history"),)),
        (
            topology.fanout,
            "event.{region}",
            (topology.queue("billing"), topology.queue("shipping")),
        ),
    )


def make_plan(seed, round_no, count, rates, topology, run_id, producers):
    """The messages of one round, in publish order."""
    rng = random.Random(f"lazarus-simulate:{seed}:{round_no}")
    faults = [rates.choose(rng) for _ in range(count)]
    # The capped queue overflows only if its messages arrive together: publish them as one block
    # (at a seeded place) and unthrottled (run.py), whatever the rate.
    burst = [f for f in faults if f == "overflow"]
    rest = [f for f in faults if f != "overflow"]
    at = rng.randint(0, len(rest))
    faults = rest[:at] + burst + rest[at:]
    routes = consumed_routes(topology)
    plan = []
    for index, fault in enumerate(faults):
        region = rng.choice(REGIONS)
        target, expiration = None, None
        if fault in ("none", *CONSUMER_FAULTS):
            exchange, template, groups = rng.choice(routes)
            routing_key = template.format(region=region)
            if fault != "none":
                target = rng.choice(groups)
        elif fault == "ttl":
            exchange, routing_key = topology.direct, "slow"
            # Half die of the queue's x-message-ttl, half of a shorter per-message expiration.
            if rng.random() < 0.5:
                expiration = max(1, topology.ttl_ms // 2)
        elif fault == "overflow":
            exchange, routing_key = topology.direct, "bulk"
        elif fault == "unroutable":
            exchange, routing_key = rng.choice(
                ((topology.direct, "refund"), (topology.topic, f"inventory.{region}.changed"))
            )
        elif fault == "returned":
            exchange, routing_key = "", topology.missing_queue
        elif fault == "nack":
            exchange, routing_key = topology.direct, "full"
        else:  # poison
            exchange, routing_key = topology.direct, "retry"
        plan.append(
            PlannedMessage(
                index=index,
                message_id=f"{run_id}-r{round_no}-{index:06d}",
                fault=fault,
                exchange=exchange,
                routing_key=routing_key,
                target_group=target,
                expiration_ms=expiration,
                producer=index % producers,
            )
        )
    return plan


def drop_points(seed, round_no, count, drops):
    """Message indices before which the simulator force-closes its connections."""
    rng = random.Random(f"lazarus-simulate-drops:{seed}:{round_no}")
    # Not before the first message: there is nothing in flight to disturb yet.
    return sorted(rng.sample(range(1, count), min(drops, max(count - 1, 0))))
