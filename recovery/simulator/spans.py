"""``simulate --telemetry otlp|mixed``: the simulator's publishers and consumers describe what they
do as OpenTelemetry messaging spans, sent to Lazarus's own intake (``POST /v1/traces``),
instead of (or, mixed, beside) writing the log contract: what a service in another language
with an OpenTelemetry instrumentation would send.

The spans say only what such an instrumentation can know: a publish is a PRODUCER ``send``
span (error status only when the attempt never reached the broker: no instrumentation sees
publisher confirms), a delivery a CONSUMER ``process`` span with the group in
``messaging.consumer.group.name``, error status when the handler failed (a reject or a
requeue). So the audit of a span-described service counts its publishes as ``sent``, its
losses as ``lost_confirmation_unknown`` and its failed deliveries as ``received_unknown``
(docs/audit.md "Traces from any service").

Built with ``opentelemetry-proto`` (a runtime requirement already, for the intake), not the
SDK: the simulator runs inside ``manage.py`` and needs no tracer provider. One ``SpanSender``
per simulation batches spans and posts them (protobuf) with an API token, retrying a 503 or
429 after its ``Retry-After``; a batch it cannot deliver is counted (``dropped``) and logged,
and the simulation's truth says how many.
"""

import logging
import os
import threading
import time
import urllib.error
import urllib.request

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

log = logging.getLogger(__name__)

PRODUCER, CONSUMER = 4, 5
STATUS_ERROR = 2
BATCH = 512
FLUSH_SECONDS = 1.0
ATTEMPTS = 5


class SpanSender:
    """Batches span protobufs per service and posts them to the intake. Thread-safe."""

    def __init__(self, endpoint, token, timeout=10.0):
        self.endpoint = endpoint
        self.token = token
        self.timeout = timeout
        self._lock = threading.Lock()
        self._pending = {}  # (service, instance) -> [Span]
        self._count = 0
        self._last = time.monotonic()
        self.sent = 0
        self.dropped = 0

    def add(self, service, instance, span):
        with self._lock:
            self._pending.setdefault((service, instance), []).append(span)
            self._count += 1
            due = self._count >= BATCH or time.monotonic() - self._last >= FLUSH_SECONDS
        if due:
            self.flush()

    def flush(self):
        with self._lock:
            pending, self._pending, count, self._count = self._pending, {}, self._count, 0
            self._last = time.monotonic()
        if not pending:
            return
        request = ExportTraceServiceRequest()
        for (service, instance), spans in pending.items():
            resource_spans = request.resource_spans.add()
            for key, value in (("service.name", service), ("service.instance.id", instance)):
                kv = resource_spans.resource.attributes.add()
                kv.key, kv.value.string_value = key, value
            scope_spans = resource_spans.scope_spans.add()
            scope_spans.scope.name = "lazarus.simulator"
            scope_spans.spans.extend(spans)
        if self._post(request.SerializeToString()):
            self.sent += count
        else:
            self.dropped += count

    def _post(self, body):
        for attempt in range(1, ATTEMPTS + 1):
            request = urllib.request.Request(
                self.endpoint,
                data=body,
                method="POST",
                headers={
                    "Content-Type": "application/x-protobuf",
                    "Authorization": f"Bearer {self.token}",
                },
            )
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    response.read()
                return True
            except urllib.error.HTTPError as error:
                if error.code not in (429, 503) or attempt == ATTEMPTS:
                    log.error(
                        "span intake %s answered %s: %s",
                        self.endpoint,
                        error.code,
                        error.read()[:300],
                    )
                    return False
                time.sleep(min(float(error.headers.get("Retry-After") or 1), 10))
            except OSError as error:
                if attempt == ATTEMPTS:
                    log.error("span intake %s unreachable: %s", self.endpoint, error)
                    return False
                time.sleep(attempt)
        return False


def _span(kind, name, start_ms, end_ms, attributes, error=False):
    from opentelemetry.proto.trace.v1.trace_pb2 import Span

    span = Span()
    span.trace_id, span.span_id = os.urandom(16), os.urandom(8)
    span.name, span.kind = name, kind
    span.start_time_unix_nano = int(start_ms * 1_000_000)
    span.end_time_unix_nano = int(max(end_ms, start_ms) * 1_000_000)
    for key, value in attributes.items():
        if value is None:
            continue
        kv = span.attributes.add()
        kv.key = key
        if isinstance(value, bool):
            kv.value.bool_value = value
        else:
            kv.value.string_value = str(value)
    if error:
        span.status.code = STATUS_ERROR
    return span


class ProducerSpans:
    """Stands in for a publisher's ``ProducerLog``: each attempt is a PRODUCER send span."""

    def __init__(self, sender, producer):
        self.sender, self.producer = sender, producer

    def attempt(self, ts_ms, message_id, exchange, routing_key, attempt, outcome, confirm_ms, size):
        span = _span(
            PRODUCER,
            f"{exchange or 'amq.default'} send",
            ts_ms,
            ts_ms + (confirm_ms or 0),
            {
                "messaging.system": "rabbitmq",
                "messaging.operation.type": "send",
                "messaging.destination.name": exchange,
                "messaging.rabbitmq.destination.routing_key": routing_key,
                "messaging.message.id": message_id,
            },
            # What an instrumentation sees fail: the publish call itself (no confirm).
            error=outcome == "error",
        )
        self.sender.add(self.producer, f"{self.producer}-{os.getpid()}", span)

    def flush_if_due(self):
        pass  # the sender flushes by size and age

    def close(self):
        self.sender.flush()


class ConsumerSpans:
    """Stands in for a consumer's ``ConsumerLog``: each delivery is a CONSUMER process span."""

    def __init__(self, sender, group, consumer, queue):
        self.sender, self.group, self.consumer, self.queue = sender, group, consumer, queue

    def delivery(self, ts_ms, message_id, redelivered, outcome, handle_ms):
        span = _span(
            CONSUMER,
            f"{self.queue} process",
            ts_ms,
            ts_ms + (handle_ms or 0),
            {
                "messaging.system": "rabbitmq",
                "messaging.operation.type": "process",
                "messaging.destination.subscription.name": self.queue,
                "messaging.consumer.group.name": self.group,
                "messaging.message.id": message_id,
                "messaging.rabbitmq.message.redelivered": bool(redelivered),
            },
            # The handler failed: rejected or requeued, which a span cannot tell apart.
            error=outcome in ("reject", "requeue"),
        )
        self.sender.add(self.consumer.split("@")[0], self.consumer, span)

    def flush_if_due(self):
        pass

    def close(self):
        self.sender.flush()
