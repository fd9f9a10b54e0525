import os
import time
from pathlib import Path

import pika.exceptions
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from recovery.db import database_conninfo
from recovery.errors import ManagementError
from recovery.simulator import Rates, Simulation, SimulationConfig
from recovery.simulator.demo import TopologyError

SUMMARY = (
    "distinct_published",
    "publish_attempts",
    "producer_retries",
    "confirmed",
    "nacked",
    "returned",
    "delivered_unique",
    "dead_lettered",
    "dead_lettered_rejected",
    "dead_lettered_expired",
    "dead_lettered_maxlen",
    "dead_lettered_delivery_limit",
    "unroutable",
    "lost",
    "dup_msgs",
    "dup_deliveries",
    "consumer_crashes",
    "connections_closed",
)


def fraction(value):
    number = float(value)
    if not 0 <= number <= 1:
        raise ValueError(value)
    return number


class Command(BaseCommand):
    help = (
        "Run producers and consumer groups over demo exchanges (direct, topic, fanout) with "
        "injected faults, write both audit logs, and print and write the ground truth (per "
        "message and totals named like the audit's metrics) plus the bindings snapshot used."
    )

    def add_arguments(self, parser):
        run = parser.add_argument_group("traffic")
        run.add_argument("--count", type=int, default=100, help="messages per round (100)")
        run.add_argument(
            "--rate", type=float, default=0, help="messages per second; 0 = unthrottled (0)"
        )
        run.add_argument("--seed", help="seed of the plan: same seed, same routes and faults")
        run.add_argument(
            "--every",
            type=float,
            default=0,
            help="start a round every N seconds until interrupted (0 = one round)",
        )
        run.add_argument(
            "--duration",
            type=float,
            default=0,
            help="keep starting rounds (back to back, or --every) for N seconds",
        )
        run.add_argument(
            "--rounds",
            type=int,
            default=0,
            help="stop after N rounds (0 = one round, or unbounded with --every/--duration)",
        )
        run.add_argument("--vhost", help="vhost to run in (default: the first RECOVERY_VHOSTS)")
        run.add_argument("--producers", type=int, default=2, help="ReliablePublishers (2)")
        run.add_argument("--consumers", type=int, default=2, help="consumers per group (2)")
        run.add_argument("--prefix", default="demo", help="name prefix of the demo topology")
        run.add_argument("--run-id", help="tag in message ids and connection names (random)")
        run.add_argument(
            "--settle-timeout",
            type=float,
            default=60,
            help="seconds a round waits for every message to be accounted for (60)",
        )
        run.add_argument(
            "--confirm-timeout",
            type=float,
            default=5.0,
            help="seconds before a publisher resends an unconfirmed message (5)",
        )
        run.add_argument(
            "--outbox",
            action="store_true",
            help="publishers hand give-ups to the recovery_outbox table of Lazarus's database "
            "when the broker is unreachable (forwarded by the forward_client_outbox task)",
        )

        faults = parser.add_argument_group(
            "faults", "shares of the messages (0..1, at most 1 together) and counts"
        )
        defaults = Rates()
        for name, help_text in (
            ("reject", "a consumer group rejects it -> recovery.dlx, reason rejected"),
            ("ttl", "to a queue with x-message-ttl / per-message expiration -> expired"),
            ("overflow", "one burst into a capped queue (x-max-length) -> maxlen, rest expire"),
            ("unroutable", "a routing key nothing binds -> alternate exchange recovery.unrouted"),
            ("returned", "to a missing queue, mandatory -> basic.return -> recovery.returns"),
            ("nack", "to a queue that refuses it (reject-publish) -> nacked -> recovery.returns"),
            ("poison", "the handler keeps failing on a quorum queue -> delivery_limit"),
            ("crash", "a consumer crashes after handling it, before the ack -> redelivered"),
        ):
            faults.add_argument(
                f"--{name}",
                type=fraction,
                default=getattr(defaults, name),
                help=f"{help_text} ({getattr(defaults, name)})",
            )
        faults.add_argument(
            "--drops",
            type=int,
            default=1,
            help="force-close the simulator's own connections (management API, this vhost, "
            "connection names lazarus-simulate/<run>/...) N times per round (1)",
        )
        faults.add_argument(
            "--late-binding",
            action="store_true",
            help="bind a queue to the fanout exchange halfway through the first round (a binding "
            "that changes during the day: the audit must not call the earlier messages its loss)",
        )
        faults.add_argument("--ttl-ms", type=int, default=1000, help="queue TTL in ms (1000)")
        faults.add_argument(
            "--max-length", type=int, default=2, help="x-max-length of the capped queue (2)"
        )
        faults.add_argument(
            "--delivery-limit",
            type=int,
            default=2,
            help="x-delivery-limit of the quorum retries queue (2)",
        )

        out = parser.add_argument_group("output")
        out.add_argument(
            "--log-dir",
            help="write the logs to DIR/producer and DIR/consumer (default: the settings "
            "AUDIT_PRODUCER_LOGS and AUDIT_CONSUMER_LOGS)",
        )
        out.add_argument(
            "--truth",
            default=str(Path(settings.BASE_DIR) / "var" / "simulate" / "truth.json"),
            help="ground truth JSON (default var/simulate/truth.json)",
        )
        out.add_argument(
            "--telemetry",
            choices=("logs", "otlp", "mixed"),
            default="logs",
            help="how publishers and consumers describe what they do: the log contract (logs), "
            "OpenTelemetry spans sent to --otlp-endpoint (otlp), or odd-numbered publishers "
            "and every second consumer group with spans, the others with logs (mixed)",
        )
        out.add_argument(
            "--otlp-endpoint",
            default=os.environ.get("LAZARUS_OTLP_ENDPOINT", "http://127.0.0.1:8000/v1/traces"),
            help="the span intake (default $LAZARUS_OTLP_ENDPOINT, else "
            "http://127.0.0.1:8000/v1/traces)",
        )
        out.add_argument(
            "--otlp-token",
            default=os.environ.get("LAZARUS_OTLP_TOKEN"),
            help="an operator's API token for it (default $LAZARUS_OTLP_TOKEN, else a new "
            "token of the user 'simulator', made an operator)",
        )
        out.add_argument(
            "--bindings-out",
            help="bindings snapshot JSON for `audit` (default: bindings.json beside --truth)",
        )

    def handle(self, *args, **options):
        config = self.config(options)
        simulation = Simulation(config, out=self.stdout.write)
        self.stdout.write(
            f"simulate: run {config.run_id}, seed {config.seed}, vhost {config.vhost!r}, "
            f"{config.count} messages per round"
        )
        started = time.monotonic()
        round_no = 0
        try:
            while True:
                round_no += 1
                round_started = time.monotonic()
                truth = simulation.run_round(round_no)
                simulation.write()
                self.stdout.write(f"round {round_no}: " + _line(truth["totals"]))
                if options["rounds"] and round_no >= options["rounds"]:
                    break
                if not (options["every"] or options["duration"] or options["rounds"]):
                    break
                pause = max(0.0, options["every"] - (time.monotonic() - round_started))
                if (
                    options["duration"]
                    and time.monotonic() + pause - started >= options["duration"]
                ):
                    break
                time.sleep(pause)
        except TopologyError as exc:
            raise CommandError(str(exc)) from exc
        except (pika.exceptions.AMQPConnectionError, ConnectionError) as exc:
            raise CommandError(f"cannot reach RabbitMQ for vhost {config.vhost!r}: {exc}") from exc
        except ManagementError as exc:
            raise CommandError(f"RabbitMQ management API (forced drops, crashes): {exc}") from exc
        except KeyboardInterrupt:
            self.stdout.write("interrupted: the truth covers the rounds that finished")
        self.stdout.write(f"totals over {len(simulation.rounds)} round(s):")
        for name in SUMMARY:
            self.stdout.write(f"  {name:30} {simulation.totals[name]}")
        self.stdout.write(f"truth: {config.truth_path}\nbindings: {config.bindings_path}")
        if simulation.totals["lost"]:
            self.stderr.write(f"{simulation.totals['lost']} expected deliveries were LOST")

    def config(self, options):
        log_dir = options["log_dir"]
        truth = options["truth"]
        try:
            return SimulationConfig(
                count=options["count"],
                rate=options["rate"],
                seed=options["seed"],
                rates=Rates(**{name: options[name] for name in Rates.__dataclass_fields__}),
                drops=options["drops"],
                producers=options["producers"],
                consumers=options["consumers"],
                vhost=options["vhost"],
                prefix=options["prefix"],
                ttl_ms=options["ttl_ms"],
                max_length=options["max_length"],
                delivery_limit=options["delivery_limit"],
                producer_log_dir=str(Path(log_dir) / "producer") if log_dir else None,
                consumer_log_dir=str(Path(log_dir) / "consumer") if log_dir else None,
                truth_path=truth,
                bindings_path=options["bindings_out"] or str(Path(truth).parent / "bindings.json"),
                settle_timeout=options["settle_timeout"],
                outbox_dsn=database_conninfo("lazarus-simulate") if options["outbox"] else None,
                confirm_timeout=options["confirm_timeout"],
                run_id=options["run_id"],
                late_binding=options["late_binding"],
                telemetry=options["telemetry"],
                otlp_endpoint=options["otlp_endpoint"],
                otlp_token=(
                    (options["otlp_token"] or simulator_token())
                    if options["telemetry"] != "logs"
                    else None
                ),
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from exc


def simulator_token():
    """A fresh API token of the operator ``simulator`` (made if missing), for its spans."""
    from django.contrib.auth import get_user_model

    from recovery.models import ApiToken, set_role

    user, _ = get_user_model().objects.get_or_create(username="simulator")
    set_role(user, "operator")
    name = "simulate --telemetry"
    for old in ApiToken.objects.filter(user=user, name=name, revoked_at__isnull=True):
        old.revoke()  # one live token: make run restarts the demo often
    return ApiToken.issue(user, name=name)[1]


def _line(totals):
    return ", ".join(f"{name}={totals[name]}" for name in SUMMARY if totals[name])
