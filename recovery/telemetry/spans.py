"""The messaging spans of an ExportTraceServiceRequest, flattened to the rows of
``schema.SPAN_SCHEMA``. Pure: no Django, no I/O.

A span is kept when it has a ``messaging.system`` attribute (any value), or is of kind PRODUCER
or CONSUMER with any ``messaging.*`` attribute; the others are skipped (counted, not rejected:
they are valid, Lazarus just does not keep them). A kept span whose ids are not 16/8 bytes, or
whose start time is missing, is rejected (the response's ``partial_success``).
"""

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime

from recovery.telemetry.schema import COLUMN_NAMES

KINDS = ("unspecified", "internal", "server", "client", "producer", "consumer")
PRODUCER, CONSUMER = 4, 5  # the OTLP proto SpanKind numbers
STATUSES = ("unset", "ok", "error")
KEPT_PREFIXES = ("messaging.", "net.", "network.", "server.")

# The current convention's values; the old ones and their newer names.
OPERATIONS = {"create", "send", "receive", "process", "settle"}
OLD_OPERATIONS = {"publish": "send", "deliver": "process"}
# messaging.operation.name is free text (the system's own verb): what each verb means.
OPERATION_NAMES = {
    "publish": "send",
    "send": "send",
    "basic.publish": "send",
    "create": "create",
    "receive": "receive",
    "get": "receive",
    "basic.get": "receive",
    "poll": "receive",
    "process": "process",
    "deliver": "process",
    "basic.deliver": "process",
    "consume": "process",
    "handle": "process",
    "ack": "settle",
    "nack": "settle",
    "reject": "settle",
    "basic.ack": "settle",
    "basic.nack": "settle",
    "basic.reject": "settle",
    "settle": "settle",
}

# The promoted columns' attributes, the current convention's name first, then the old one's
# (``_row``): messaging_system messaging.system; destination messaging.destination.name |
# messaging.destination; routing_key messaging.rabbitmq.destination.routing_key |
# messaging.rabbitmq.routing_key; message_id messaging.message.id | messaging.message_id;
# consumer_group messaging.consumer.group.name; conversation_id
# messaging.message.conversation_id | messaging.conversation_id.
DELIVERY_TAG = "messaging.rabbitmq.message.delivery_tag"
ZERO_SPAN, ZERO_TRACE = bytes(8), bytes(16)


@dataclass
class Flattened:
    """The rows of one request, by (day, hour) of their start; and what was not kept."""

    by_hour: dict = field(default_factory=dict)  # ("YYYY-MM-DD", "HH") -> {column: [values]}
    kept: int = 0
    skipped: int = 0  # not messaging spans
    rejected: int = 0  # messaging spans that cannot be rows
    errors: list = field(default_factory=list)  # a few reasons, for partial_success

    def reject(self, reason):
        self.rejected += 1
        if len(self.errors) < 5 and reason not in self.errors:
            self.errors.append(reason)

    @property
    def error_message(self):
        return "; ".join(self.errors)


def text_of(value):
    """An AnyValue as text: strings as they are, booleans true/false, numbers in decimal,
    arrays and maps as JSON, bytes as lowercase hex; None when unset."""
    which = value.WhichOneof("value")
    if which == "string_value":
        return value.string_value
    if which == "int_value":
        return str(value.int_value)
    if which == "bool_value":
        return "true" if value.bool_value else "false"
    if which == "double_value":
        return repr(value.double_value)
    if which == "bytes_value":
        return value.bytes_value.hex()
    if which is None:
        return None
    return json.dumps(_plain(value), separators=(",", ":"), ensure_ascii=False)


def _plain(value):
    which = value.WhichOneof("value")
    if which == "array_value":
        return [_plain(v) for v in value.array_value.values]
    if which == "kvlist_value":
        return {kv.key: _plain(kv.value) for kv in value.kvlist_value.values}
    if which == "int_value":
        return value.int_value
    if which == "double_value":
        return value.double_value
    if which == "bool_value":
        return value.bool_value
    if which == "bytes_value":
        return value.bytes_value.hex()
    if which == "string_value":
        return value.string_value
    return None


def operation_of(attributes, kind):
    """The operation in the current convention's values (see schema's ``operation``)."""
    value = attributes.get("messaging.operation.type") or attributes.get("messaging.operation")
    if value:
        value = value.lower()
        return OLD_OPERATIONS.get(value, value)
    name = attributes.get("messaging.operation.name")
    if name and name.lower() in OPERATION_NAMES:
        return OPERATION_NAMES[name.lower()]
    if kind == PRODUCER:
        return "send"
    if kind == CONSUMER:
        return "process"
    return name.lower() if name else None


def _resource_facts(resource):
    service = instance = host = None
    for kv in resource.attributes:
        if kv.key == "service.name":
            service = text_of(kv.value)
        elif kv.key == "service.instance.id":
            instance = text_of(kv.value)
        elif kv.key == "host.name":
            host = text_of(kv.value)
    return service, instance or host


def hour_of(start_ns):
    moment = datetime.fromtimestamp(start_ns // 1_000_000_000, UTC)
    return moment.strftime("%Y-%m-%d"), moment.strftime("%H")


def flatten(request):
    """The Flattened rows of an ExportTraceServiceRequest.

    The intake's hot loop (bench/otlp_intake.py): each kept span becomes one tuple in
    COLUMN_NAMES order, and each hour's tuples are turned into columns once at the end."""
    out = Flattened()
    rows_by_hour = {}
    hours = {}  # start second -> (day, hour): a batch's spans share few seconds
    kept_prefixes = KEPT_PREFIXES
    for resource_spans in request.resource_spans:
        service, instance = _resource_facts(resource_spans.resource)
        for scope_spans in resource_spans.scope_spans:
            facts = (service, instance, scope_spans.scope.name or None)
            for span in scope_spans.spans:
                kind = span.kind
                attributes = {}
                for kv in span.attributes:
                    key = kv.key
                    if key.startswith(kept_prefixes):
                        value = kv.value
                        text = value.string_value  # most are strings: no WhichOneof for them
                        if not text:
                            text = text_of(value)
                            if text is None:
                                continue
                        attributes[key] = text
                if "messaging.system" not in attributes and not (
                    kind in (PRODUCER, CONSUMER)
                    and any(name.startswith("messaging.") for name in attributes)
                ):
                    out.skipped += 1
                    continue
                trace_id, span_id = span.trace_id, span.span_id
                start, parent = span.start_time_unix_nano, span.parent_span_id
                links = span.links
                if (
                    len(trace_id) != 16
                    or len(span_id) != 8
                    or trace_id == ZERO_TRACE
                    or span_id == ZERO_SPAN
                    or not 0 < start < 2**63
                    or span.end_time_unix_nano >= 2**63
                    or (parent and len(parent) != 8)
                    or (links and _invalid(span))
                ):
                    out.reject(_invalid(span))
                    continue
                second = start // 1_000_000_000
                key = hours.get(second)
                if key is None:
                    key = hours[second] = hour_of(start)
                rows = rows_by_hour.get(key)
                if rows is None:
                    rows = rows_by_hour[key] = []
                rows.append(
                    _row(span, trace_id, span_id, parent, start, links, kind, attributes, facts)
                )
    for key, rows in rows_by_hour.items():
        out.by_hour[key] = dict(zip(COLUMN_NAMES, map(list, zip(*rows, strict=True)), strict=True))
        out.kept += len(rows)
    return out


def _invalid(span):
    """Why a span cannot be a row (None if it can)."""
    if len(span.trace_id) != 16 or span.trace_id == bytes(16):
        return "a span with an invalid trace_id"
    if len(span.span_id) != 8 or span.span_id == bytes(8):
        return "a span with an invalid span_id"
    if span.parent_span_id and len(span.parent_span_id) != 8:
        return "a span with an invalid parent_span_id"
    if span.start_time_unix_nano == 0 or span.start_time_unix_nano >= 2**63:
        return "a span with no start time"
    if span.end_time_unix_nano >= 2**63:
        return "a span with an invalid end time"
    for link in span.links:
        if len(link.trace_id) != 16 or len(link.span_id) != 8:
            return "a span with an invalid link"
    return None


def _row(span, trace_id, span_id, parent, start, links, kind, attributes, facts):
    """One span's values in COLUMN_NAMES order; ``facts``: (service, instance, scope)."""
    status = span.status
    code = status.code
    get = attributes.get
    tag = get(DELIVERY_TAG)
    # The promoted columns: the current convention's attribute, else the old one's.
    destination = get("messaging.destination.name")
    if destination is None:
        destination = get("messaging.destination")
    routing_key = get("messaging.rabbitmq.destination.routing_key")
    if routing_key is None:
        routing_key = get("messaging.rabbitmq.routing_key")
    message_id = get("messaging.message.id")
    if message_id is None:
        message_id = get("messaging.message_id")
    conversation = get("messaging.message.conversation_id")
    if conversation is None:
        conversation = get("messaging.conversation_id")
    return (
        trace_id.hex(),
        span_id.hex(),
        parent.hex() if parent and parent != ZERO_SPAN else None,
        [{"trace_id": link.trace_id.hex(), "span_id": link.span_id.hex()} for link in links]
        if links
        else [],
        span.name,
        KINDS[kind] if 0 <= kind < len(KINDS) else str(kind),
        start,
        span.end_time_unix_nano,
        STATUSES[code] if 0 <= code < len(STATUSES) else str(code),
        status.message or None,
        *facts,
        get("messaging.system"),
        operation_of(attributes, kind),
        destination,
        routing_key,
        message_id,
        get("messaging.consumer.group.name"),
        conversation,
        _int_or_none(tag),
        list(attributes.items()),
    )


def _int_or_none(text):
    """A 64-bit integer attribute's value, None when absent or not one."""
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    return value if -(2**63) <= value < 2**63 else None
