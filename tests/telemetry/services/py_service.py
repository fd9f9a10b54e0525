"""A Python service nobody at Lazarus wrote: pika, instrumented by OpenTelemetry (#47).

It uses only what a team running OpenTelemetry would: ``PikaInstrumentor`` (the contrib
package ``opentelemetry-instrumentation-pika``), the SDK's ``BatchSpanProcessor`` and the
``opentelemetry-exporter-otlp-proto-http`` ``OTLPSpanExporter``. Nothing here adds a span or an
attribute: what reaches the OTLP endpoint is what the instrumentation emits. It imports nothing
of Lazarus and runs as a script::

    python py_service.py produce --amqp-url amqp://guest:guest@127.0.0.1:5672/v \\
        --exchange orders --routing-key orders.created --count 100 \\
        --otlp-endpoint http://127.0.0.1:8000/v1/traces --header 'Authorization=Bearer T' \\
        --record produced.jsonl
    python py_service.py consume --amqp-url ... --queue orders.billing --group billing \\
        --reject 'ids:m-3,m-7' --idle 1.5 --otlp-endpoint ... --record consumed.jsonl

The ``--record`` file is the service's own account of what it did, one JSON object a line (the
test's truth, never read by the audit): for each publish its sequence number, message id (or
none), body, the trace and span id of its publish span, and its outcome (``confirmed``,
``nacked``, ``unroutable``, ``connection_lost``, or ``sent`` without confirms); for each delivery
the same ids and what the consumer did (``ack`` or ``reject``).

Producer faults are the broker's or the test's (a connection closed through the management API):
on a lost connection the producer reconnects and goes on with the next message, as an
application that logs the error would; ``--retry`` republishes the message whose publish failed
(a duplicate, if the broker had it before the connection went).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import time
import uuid

import pika
import pika.exceptions
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.instrumentation.pika import PikaInstrumentor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

CONNECTION_ERRORS = (
    pika.exceptions.AMQPConnectionError,
    pika.exceptions.ConnectionClosed,
    pika.exceptions.StreamLostError,
    pika.exceptions.ChannelWrongStateError,
    pika.exceptions.ChannelClosed,
    ConnectionResetError,
    BrokenPipeError,
)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("role", choices=["produce", "consume"])
    parser.add_argument("--amqp-url", default="amqp://guest:guest@127.0.0.1:5672/%2F")
    parser.add_argument("--exchange", default="orders")
    parser.add_argument("--exchange-type", default="topic")
    parser.add_argument("--routing-key", default="orders.created")
    parser.add_argument("--queue", help="consume: the queue (bound to the exchange if --declare)")
    parser.add_argument(
        "--group",
        help="consume: its consumer group name, used as the consumer tag (default: the queue)",
    )
    parser.add_argument(
        "--declare",
        action="store_true",
        help="declare the exchange (produce, consume) and the queue and its binding (consume)",
    )
    parser.add_argument(
        "--queue-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a queue argument for --declare (integers stay integers): x-message-ttl=200, "
        "x-max-length=10, x-overflow=drop-head, x-dead-letter-exchange=recovery.dlx",
    )
    parser.add_argument("--count", type=int, default=10, help="produce: messages to publish")
    parser.add_argument("--id-prefix", default="", help="produce: message ids are <prefix><seq>")
    parser.add_argument(
        "--no-id-every",
        type=int,
        default=0,
        metavar="N",
        help="produce: every Nth message (seq %% N == 0) has no properties.message_id",
    )
    parser.add_argument(
        "--rate", type=float, default=0, help="produce: messages per second (0: as fast)"
    )
    parser.add_argument(
        "--no-confirm", action="store_true", help="produce: no publisher confirms (fire and forget)"
    )
    parser.add_argument(
        "--retry", action="store_true", help="produce: republish a failed publish once"
    )
    parser.add_argument(
        "--reject",
        default="",
        help="consume: which deliveries to reject with requeue=False: 'ids:a,b', 'every:N' "
        "(seq %% N == 0), 're:PATTERN' on the message id, or empty",
    )
    parser.add_argument(
        "--idle", type=float, default=2.0, help="consume: stop after this long without a delivery"
    )
    parser.add_argument(
        "--expect",
        type=int,
        default=0,
        help="consume: the idle time counts only once this many deliveries came",
    )
    parser.add_argument(
        "--max-seconds", type=float, default=60.0, help="consume: stop after this long"
    )
    parser.add_argument("--prefetch", type=int, default=50)
    parser.add_argument(
        "--otlp-endpoint", required=True, help="the full URL, e.g. http://host/v1/traces"
    )
    parser.add_argument(
        "--header", action="append", default=[], metavar="KEY=VALUE", help="an OTLP header"
    )
    parser.add_argument("--service-name", default=None)
    parser.add_argument("--record", help="write the service's own account here (JSON lines)")
    parser.add_argument(
        "--ready-file", help="consume: touched once the consumer is subscribed (tests wait for it)"
    )
    parser.add_argument(
        "--start-file",
        help="produce: once connected, wait for this file to exist before publishing",
    )
    return parser.parse_args(argv)


def queue_arguments(pairs):
    arguments = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        arguments[key] = int(value) if re.fullmatch(r"-?\d+", value) else value
    return arguments


def service_name(args):
    return args.service_name or f"py-{args.role}"


def connection_parameters(args):
    # The connection is named after the service, as applications do: the management API shows
    # it as user_provided_name (the fault injection finds the producer's connection by it).
    parameters = pika.URLParameters(args.amqp_url)
    parameters.client_properties = {"connection_name": service_name(args)}
    return parameters


def setup_tracing(args):
    headers = dict(pair.partition("=")[::2] for pair in args.header)
    provider = TracerProvider(resource=Resource.create({"service.name": service_name(args)}))
    provider.add_span_processor(
        BatchSpanProcessor(
            OTLPSpanExporter(endpoint=args.otlp_endpoint, headers=headers, timeout=10),
            schedule_delay_millis=200,
        )
    )
    trace.set_tracer_provider(provider)
    return provider


class Record:
    def __init__(self, path):
        self.file = open(path, "a", buffering=1) if path else None  # noqa: SIM115

    def write(self, **fields):
        if self.file:
            self.file.write(json.dumps(fields, sort_keys=True) + "\n")

    def close(self):
        if self.file:
            self.file.close()


def span_ids(span):
    context = span.get_span_context()
    return {
        "trace_id": format(context.trace_id, "032x"),
        "span_id": format(context.span_id, "016x"),
    }


class Producer:
    def __init__(self, args, record):
        self.args, self.record = args, record
        self.channel = None
        self.last_span = None

    def publish_hook(self, span, body, properties):
        # The instrumentation's documented hook, used only to learn the span's ids for the
        # truth record: it sets nothing on the span.
        self.last_span = span

    def connect(self):
        connection = pika.BlockingConnection(connection_parameters(self.args))
        channel = connection.channel()
        if self.args.declare:
            channel.exchange_declare(self.args.exchange, self.args.exchange_type, durable=True)
        if not self.args.no_confirm:
            channel.confirm_delivery()
        self.channel = channel

    def publish(self, seq, message_id, body):
        properties = pika.BasicProperties(
            message_id=message_id, delivery_mode=2, content_type="application/json"
        )
        self.last_span = None
        try:
            if self.channel is None:
                self.connect()
            self.channel.basic_publish(
                self.args.exchange, self.args.routing_key, body, properties, mandatory=True
            )
            outcome = "sent" if self.args.no_confirm else "confirmed"
        except pika.exceptions.UnroutableError:
            outcome = "unroutable"
        except pika.exceptions.NackError:
            outcome = "nacked"
        except CONNECTION_ERRORS:
            outcome = "connection_lost"
            self.close()
        return outcome, self.last_span

    def close(self):
        if self.channel is not None:
            with contextlib.suppress(Exception):  # it may be gone already
                self.channel.connection.close()
        self.channel = None

    def run(self):
        interval = 1 / self.args.rate if self.args.rate else 0
        if self.args.start_file:
            self.connect()
            while not os.path.exists(self.args.start_file):
                self.channel.connection.process_data_events(time_limit=0.02)
        started = time.monotonic()
        for seq in range(1, self.args.count + 1):
            no_id = self.args.no_id_every and seq % self.args.no_id_every == 0
            message_id = None if no_id else f"{self.args.id_prefix}{seq}"
            body = json.dumps({"seq": seq, "id": message_id, "nonce": uuid.uuid4().hex}).encode()
            attempts = 2 if self.args.retry else 1
            for attempt in range(1, attempts + 1):
                outcome, span = self.publish(seq, message_id, body)
                self.record.write(
                    event="publish",
                    seq=seq,
                    message_id=message_id,
                    body=body.decode(),
                    attempt=attempt,
                    outcome=outcome,
                    at=time.time(),
                    **(span_ids(span) if span is not None else {}),
                )
                if outcome != "connection_lost":
                    break
            if interval:
                delay = started + seq * interval - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
        self.close()


class Consumer:
    def __init__(self, args, record):
        self.args, self.record = args, record
        self.rule = self.parse_rule(args.reject)
        self.last_delivery = time.monotonic()
        self.seen = 0

    @staticmethod
    def parse_rule(rule):
        kind, _, value = rule.partition(":")
        if not rule:
            return lambda seq, message_id: False
        if kind == "ids":
            ids = set(value.split(","))
            return lambda seq, message_id: message_id in ids
        if kind == "every":
            n = int(value)
            return lambda seq, message_id: seq is not None and seq % n == 0
        if kind == "re":
            pattern = re.compile(value)
            return lambda seq, message_id: bool(message_id and pattern.search(message_id))
        raise SystemExit(f"--reject: unknown rule {rule!r}")

    def on_message(self, channel, method, properties, body):
        self.last_delivery = time.monotonic()
        self.seen += 1
        try:
            seq = json.loads(body).get("seq")
        except ValueError:
            seq = None
        message_id = properties.message_id
        reject = self.rule(seq, message_id)
        if reject:
            channel.basic_reject(method.delivery_tag, requeue=False)
        else:
            channel.basic_ack(method.delivery_tag)
        span = trace.get_current_span()
        self.record.write(
            event="deliver",
            seq=seq,
            message_id=message_id,
            body=body.decode(errors="replace"),
            routing_key=method.routing_key,
            redelivered=method.redelivered,
            action="reject" if reject else "ack",
            queue=self.args.queue,
            group=self.args.group or self.args.queue,
            at=time.time(),
            **span_ids(span),
        )

    def run(self):
        connection = pika.BlockingConnection(connection_parameters(self.args))
        channel = connection.channel()
        if self.args.declare:
            channel.exchange_declare(self.args.exchange, self.args.exchange_type, durable=True)
            channel.queue_declare(
                self.args.queue, durable=True, arguments=queue_arguments(self.args.queue_arg)
            )
            channel.queue_bind(self.args.queue, self.args.exchange, self.args.routing_key)
        channel.basic_qos(prefetch_count=self.args.prefetch)
        channel.basic_consume(
            self.args.queue, self.on_message, consumer_tag=self.args.group or self.args.queue
        )
        if self.args.ready_file:
            open(self.args.ready_file, "w").close()  # noqa: SIM115
        started = self.last_delivery = time.monotonic()
        while True:
            connection.process_data_events(time_limit=0.1)
            now = time.monotonic()
            idle = now - self.last_delivery > self.args.idle and self.seen >= self.args.expect
            if idle or now - started > self.args.max_seconds:
                break
        connection.close()


def main(argv=None):
    args = parse_args(argv)
    if args.role == "consume" and not args.queue:
        raise SystemExit("consume needs --queue")
    provider = setup_tracing(args)
    record = Record(args.record)
    try:
        if args.role == "produce":
            service = Producer(args, record)
            PikaInstrumentor().instrument(
                tracer_provider=provider, publish_hook=service.publish_hook
            )
        else:
            service = Consumer(args, record)
            PikaInstrumentor().instrument(tracer_provider=provider)
        service.run()
    finally:
        record.close()
        provider.force_flush(timeout_millis=15000)
        provider.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
