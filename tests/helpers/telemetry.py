"""Spans from the real OpenTelemetry SDK, encoded by the real OTLP exporter's encoder (#47)."""

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

START = 1_796_000_000_000_000_000  # 2026-11-30T00:53:20Z


def sdk_request():
    """Three spans from the real SDK: an old-convention producer (pika's attribute set), a
    current-convention consumer, and an HTTP span that is no messaging span."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource({"service.name": "orders", "host.name": "web-1"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("opentelemetry.instrumentation.pika")
    old = {
        "messaging.system": "rabbitmq",
        "messaging.destination": "orders",
        "messaging.rabbitmq.routing_key": "orders.created",
        "messaging.message_id": "m-1",
        "messaging.conversation_id": "c-1",
        "net.peer.port": 5672,
        "http.method": "ignored",
    }
    span = tracer.start_span(
        "orders send", kind=SpanKind.PRODUCER, attributes=old, start_time=START
    )
    span.end(end_time=START + 1000)
    current = {
        "messaging.operation.type": "process",
        "messaging.destination.name": "orders",
        "messaging.rabbitmq.destination.routing_key": "orders.created",
        "messaging.message.id": "m-1",
        "messaging.consumer.group.name": "billing",
        "messaging.rabbitmq.message.delivery_tag": 7,
        "server.address": "rabbit",
    }
    span = tracer.start_span(
        "orders process", kind=SpanKind.CONSUMER, attributes=current, start_time=START + 2000
    )
    span.end(end_time=START + 3000)
    tracer.start_span("GET /", kind=SpanKind.SERVER, start_time=START).end(end_time=START + 1)
    finished = memory.get_finished_spans()
    return encode_spans(finished), finished
