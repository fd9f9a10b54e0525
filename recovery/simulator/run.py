"""One simulation: rounds of seeded traffic with injected faults, and the ground truth they leave.

A round: declare the topology, start the taps and the consumer groups, publish the plan through
ReliablePublishers (force-closing the simulator's connections at the planned points), wait until
every message is accounted for and every demo queue is empty, stop the consumers, and turn what
was observed into the truth. Rounds are self-contained: nothing of a round is still in flight
when its truth is written.
"""

import dataclasses
import datetime
import json
import logging
import os
import time
import uuid
from pathlib import Path

import pika
from django.conf import settings

from recovery.broker.management import Management
from recovery.broker.topology import Names, declare_recovery_topology
from recovery.client import ReliablePublisher
from recovery.simulator.connections import Connections, Dropper, named_url
from recovery.simulator.consumers import start_group_workers, stop_group_workers
from recovery.simulator.demo import DemoTopology, expected_groups
from recovery.simulator.observe import Observer, Taps, observe_publisher
from recovery.simulator.plan import Rates, drop_points, make_plan
from recovery.simulator.spans import ProducerSpans, SpanSender
from recovery.simulator.truth import CONSUMED, TOTAL_NAMES, add_totals, build_truth

log = logging.getLogger(__name__)

# After the last observed event, how long the round waits before it calls the queues quiet: long
# enough for a crashed consumer's requeued messages to reach its restarted successor.
QUIET_S = 0.5
# Stop-and-check cycles before a round gives up on an empty queue (a crash or drop in the tail).
DRAIN_ROUNDS = 5
# Per-message truth kept for the most recent messages only, so a simulator looping for days
# (make run) keeps a bounded truth file; the totals always cover every round.
MESSAGES_KEPT = 20_000


TELEMETRY = ("logs", "otlp", "mixed")


@dataclasses.dataclass
class SimulationConfig:
    count: int = 100
    rate: float = 0.0  # messages per second; 0 = as fast as the publishers take them
    seed: str | None = None
    rates: Rates = dataclasses.field(default_factory=Rates)
    drops: int = 0  # forced connection drops per round
    producers: int = 2
    consumers: int = 2  # consumers per group
    vhost: str | None = None
    prefix: str = "demo"
    ttl_ms: int = 1000
    max_length: int = 2
    delivery_limit: int = 2
    producer_log_dir: str | None = None
    consumer_log_dir: str | None = None
    truth_path: str | None = None
    bindings_path: str | None = None
    settle_timeout: float = 60.0
    outbox_dsn: str | None = None
    confirm_timeout: float = 5.0  # a publish attempt unconfirmed this long is resent
    run_id: str | None = None
    late_binding: bool = False  # bind the fanout's "latecomer" queue halfway through round 1
    # logs: every publisher and consumer writes the log contract; otlp: they send spans to the
    # intake instead (recovery/simulator/spans.py); mixed: odd-numbered publishers and every
    # second consumer group send spans, the others log.
    telemetry: str = "logs"
    otlp_endpoint: str | None = None
    otlp_token: str | None = None

    def __post_init__(self):
        if self.count < 1:
            raise ValueError("--count must be at least 1")
        if self.rate < 0:
            raise ValueError("--rate must not be negative")
        if self.producers < 1 or self.consumers < 1:
            raise ValueError("--producers and --consumers must be at least 1")
        if self.drops < 0 or self.delivery_limit < 0:
            raise ValueError("--drops and --delivery-limit must not be negative")
        if self.ttl_ms < 1 or self.max_length < 1:
            raise ValueError("--ttl-ms and --max-length must be at least 1")
        if self.settle_timeout <= 0 or self.confirm_timeout <= 0:
            raise ValueError("--settle-timeout and --confirm-timeout must be positive")
        if self.telemetry not in TELEMETRY:
            raise ValueError(f"--telemetry must be one of {', '.join(TELEMETRY)}")
        if self.telemetry != "logs" and not (self.otlp_endpoint and self.otlp_token):
            raise ValueError("--telemetry otlp|mixed needs --otlp-endpoint and a token")
        self.seed = self.seed if self.seed is not None else uuid.uuid4().hex[:12]
        self.run_id = self.run_id or uuid.uuid4().hex[:8]
        self.vhost = self.vhost or settings.RECOVERY_VHOSTS[0]
        self.producer_log_dir = self.producer_log_dir or settings.AUDIT_PRODUCER_LOGS
        self.consumer_log_dir = self.consumer_log_dir or settings.AUDIT_CONSUMER_LOGS


class Simulation:
    def __init__(self, config, out=None):
        self.config = config
        self.out = out or (lambda line: None)
        self.names = Names.from_settings()
        self.topology = DemoTopology(
            config.prefix,
            config.ttl_ms,
            config.max_length,
            config.delivery_limit,
            late_binding=config.late_binding,
        )
        self.bindings = self.topology.bindings()
        self.connections = Connections(Management(), config.vhost, config.run_id)
        self.observer = None
        self._planned = {}
        self.rounds = []  # per round: {"round", "started_at", "finished_at", "totals", ...}
        self.messages = {}
        self.messages_dropped = 0  # older per-message entries left out (MESSAGES_KEPT)
        self.totals = dict.fromkeys(TOTAL_NAMES, 0)
        self.span_sender = (
            SpanSender(config.otlp_endpoint, config.otlp_token)
            if config.telemetry != "logs"
            else None
        )

    def spans_for_producer(self, index):
        """Whether publisher ``index`` sends spans instead of logging (``--telemetry``)."""
        mode = self.config.telemetry
        return mode == "otlp" or (mode == "mixed" and index % 2 == 1)

    def spans_for_group(self, group):
        mode = self.config.telemetry
        if mode != "mixed":
            return mode == "otlp"
        groups = sorted({b["consumer_group"] for b in self.bindings})
        return group in groups and groups.index(group) % 2 == 1

    def url(self, connection_name):
        return named_url(settings.RABBITMQ_URL, self.config.vhost, connection_name)

    def _connect(self, purpose):
        name = self.connections.run_prefix + purpose  # not a drop target
        return pika.BlockingConnection(pika.URLParameters(self.url(name)))

    def planned(self, message_id):
        return self._planned.get(message_id)

    # ---- a round ------------------------------------------------------------------------------

    def run_round(self, round_no):
        cfg = self.config
        started = _now()
        plan = make_plan(
            cfg.seed, round_no, cfg.count, cfg.rates, self.topology, cfg.run_id, cfg.producers
        )
        self._planned = {m.message_id: m for m in plan}
        self.observer = Observer()
        self._declare()
        taps = Taps(
            pika.URLParameters(self.url(self.connections.tap_name())),
            f"{cfg.run_id}.r{round_no}",
            self.names.dlx,
            self.names.unrouted,
            self.observer,
        )
        taps.start()
        workers = start_group_workers(self, self.topology.queues, cfg.consumers)
        complete = False
        try:
            self._publish(plan, drop_points(cfg.seed, round_no, cfg.count, cfg.drops))
            complete = self._settle(plan, workers)
        finally:
            stop_group_workers(workers)
            taps.stop()
            taps.delete()
            if self.span_sender is not None:
                self.span_sender.flush()  # a round's spans are all sent before its truth
        truth = build_truth(plan, self.observer.snapshot(), self.bindings)
        skipped = self._say_skipped(round_no)
        self.rounds.append(
            {
                "round": round_no,
                "started_at": started,
                "finished_at": _now(),
                "complete": complete,
                "totals": truth["totals"],
                "faults_skipped": skipped,
            }
        )
        self.messages.update(truth["messages"])
        while len(self.messages) > MESSAGES_KEPT:
            del self.messages[next(iter(self.messages))]
            self.messages_dropped += 1
        self.totals = add_totals(self.totals, truth["totals"])
        return truth

    def _say_skipped(self, round_no):
        """Say which faults were not injected (the management API unreachable): the round ran
        without them, and its truth counts only the closes that happened."""
        skipped = self.observer.skipped_reasons()
        if skipped:
            self.out(
                f"WARNING: round {round_no}: {len(skipped)} fault(s) skipped, the RabbitMQ "
                f"management API is unreachable: {skipped[0]}"
            )
        return len(skipped)

    def _declare(self):
        connection = self._connect("setup")
        try:
            declare_recovery_topology(connection.channel(), self.names)
            self.topology.declare(connection, self.names.dlx, self.names.unrouted)
        finally:
            if connection.is_open:
                connection.close()

    def _publisher(self, index):
        cfg = self.config
        publisher = ReliablePublisher(
            self.url(self.connections.producer_name(index)),
            producer=f"simulate-{index}",
            log_dir=cfg.producer_log_dir,
            returns_queue=self.names.returns,
            outbox_dsn=cfg.outbox_dsn,
            confirm_timeout=cfg.confirm_timeout,
        )
        if self.spans_for_producer(index):
            # Before any message flows (observe_publisher wraps whatever ``_log`` is then).
            publisher._log = ProducerSpans(self.span_sender, f"simulate-{index}")
        return publisher

    def _publish(self, plan, drops_before):
        cfg = self.config
        publishers = [
            observe_publisher(self._publisher(i), self.observer) for i in range(cfg.producers)
        ]
        drops = set(drops_before)
        dropper = Dropper(self.connections, self.observer)
        dropper.start()
        try:
            started = time.monotonic()
            bind_late_at = cfg.count // 2 if self._late_unbound() else None
            for message in plan:
                if message.index == bind_late_at:
                    self._bind_late()
                if message.index in drops:
                    dropper.request()
                if cfg.rate and message.fault != "overflow":
                    delay = started + message.index / cfg.rate - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
                publishers[message.producer].publish(
                    message.exchange,
                    message.routing_key,
                    message.body(),
                    message.properties(),
                    message_id=message.message_id,
                )
        finally:
            try:
                dropper.finish()  # before the publishers close: a drop is meant to hit them
            finally:
                # Even when a drop failed: a publisher left open keeps resending this run's
                # messages into the next run's queues (seen once: a drop's HTTP 500 left them).
                for publisher in publishers:
                    publisher.close(timeout=cfg.settle_timeout)

    def _late_unbound(self):
        bound = {b["queue"] for b in self.bindings}
        return any(b["queue"] not in bound for b in self.topology.bindings(late=True))

    def _bind_late(self):
        """Bind the late queues; from now on (the broker has confirmed) every message published
        reaches them, so each binding's ``from_ms`` is taken after the bind-ok."""
        connection = self._connect("setup")
        try:
            self.topology.bind_late(connection)
        finally:
            if connection.is_open:
                connection.close()
        from_ms = int(time.time() * 1000)
        self.bindings += [{**b, "from_ms": from_ms} for b in self.topology.bindings(late=True)]
        self.out(f"bound the late queue(s) at {from_ms}")

    def _settle(self, plan, workers):
        """Wait until every message is accounted for and the demo queues are empty."""
        deadline = time.monotonic() + self.config.settle_timeout
        while self._unaccounted(plan) and time.monotonic() < deadline:
            time.sleep(0.05)
        for _ in range(DRAIN_ROUNDS):
            while time.monotonic() < deadline and not (
                self.observer.idle_for() >= QUIET_S and not any(self._depths().values())
            ):
                time.sleep(0.05)
            # A consumer holds its prefetched deliveries unacked: only once all are closed does
            # the queue depth say what is really left.
            stop_group_workers(workers)
            left = {q: n for q, n in self._depths().items() if n}
            if not left and not self._unaccounted(plan):
                return True
            if time.monotonic() >= deadline:
                break
            workers[:] = start_group_workers(self, self.topology.queues, self.config.consumers)
        unaccounted = self._unaccounted(plan)
        self.out(
            f"WARNING: round not settled after {self.config.settle_timeout:.0f}s: "
            f"{len(unaccounted)} message(s) unaccounted, queues {self._depths()}"
        )
        return False

    def _unaccounted(self, plan):
        """Planned messages whose fate is not yet observed (see truth.py for the fates)."""
        seen = self.observer.snapshot()
        return [m.message_id for m in plan if not _accounted(m, seen, self.bindings)]

    def _depths(self):
        connection = self._connect("depths")
        try:
            channel = connection.channel()
            return {
                q.name: channel.queue_declare(q.name, passive=True).method.message_count
                for q in self.topology.queues
            }
        finally:
            connection.close()

    # ---- output -------------------------------------------------------------------------------

    def truth_document(self):
        cfg = self.config
        return {
            "version": 1,
            "run_id": cfg.run_id,
            "seed": cfg.seed,
            "vhost": cfg.vhost,
            "settings": {
                "count": cfg.count,
                "rate": cfg.rate,
                "drops": cfg.drops,
                "producers": cfg.producers,
                "consumers": cfg.consumers,
                "fault_rates": dataclasses.asdict(cfg.rates),
                "prefix": cfg.prefix,
                "ttl_ms": cfg.ttl_ms,
                "max_length": cfg.max_length,
                "delivery_limit": cfg.delivery_limit,
                "confirm_timeout": cfg.confirm_timeout,
            },
            "logs": {"producer": cfg.producer_log_dir, "consumer": cfg.consumer_log_dir},
            # Spans (--telemetry otlp|mixed): who sent them, and how many the intake did not
            # take. A span-described publish is "sent" (confirmation unknown) in the audit, so
            # its losses are lost_confirmation_unknown there, never the truth's "lost".
            "telemetry": {
                "mode": cfg.telemetry,
                "endpoint": cfg.otlp_endpoint,
                "span_producers": [
                    f"simulate-{i}" for i in range(cfg.producers) if self.spans_for_producer(i)
                ],
                "span_groups": sorted(
                    {
                        b["consumer_group"]
                        for b in self.bindings
                        if self.spans_for_group(b["consumer_group"])
                    }
                ),
                "spans_sent": self.span_sender.sent if self.span_sender else 0,
                "spans_dropped": self.span_sender.dropped if self.span_sender else 0,
            },
            "bindings": self.bindings,
            "bindings_path": cfg.bindings_path,
            "rounds": self.rounds,
            "totals": self.totals,
            "messages_left_out": self.messages_dropped,
            "messages": self.messages,
        }

    def write(self):
        """Write the truth and the bindings snapshot (atomically: a reader never sees half)."""
        for path, document in (
            (self.config.truth_path, self.truth_document()),
            (self.config.bindings_path, self.bindings),
        ):
            if path:
                _write_json(path, document)


def _accounted(message, seen, bindings):
    """Has this message's fate been observed? Called once the publishers are closed."""
    mid = message.message_id
    outcomes = [outcome for _, outcome in seen["attempts"].get(mid, [])]
    if not outcomes:
        return False
    if "ack" not in outcomes:
        # Closing a publisher waits until each message is acked or handed to Lazarus (returned,
        # nacked, given up): nothing more will happen to it.
        return True
    first_ts = seen.get("first_ts", {}).get(mid)
    groups = expected_groups(bindings, message.exchange, message.routing_key, first_ts)
    if not groups:
        return seen["unrouted"].get(mid, 0) > 0
    died_in = {queue for queue, _ in seen["dead_letters"].get(mid, [])}
    for group in groups:  # a demo group is named after its queue
        lines = seen["deliveries"].get((mid, group), [])
        if group not in died_in and not any(o in CONSUMED for o, _ in lines):
            return False
    return True


def _write_json(path, document):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    tmp.write_text(json.dumps(document, indent=1, sort_keys=False, default=str))
    os.replace(tmp, path)


def _now():
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds")
