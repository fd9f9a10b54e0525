"""The span rows' Arrow schema: one row per messaging span, as the intake writes them to Parquet
under ``AUDIT_SPANS/dt=YYYY-MM-DD/hour=HH/`` (the day and hour, UTC, of the span's start).

Pure: imports pyarrow only (no Django, nothing of Lazarus), so the Spark side can read it.

Text values are as the span says them; a promoted column is null when no attribute of either
convention names it (never an empty string made up). Ids are lowercase hex. The partition
columns ``dt`` and ``hour`` are in the path, not in the files.
"""

import pyarrow as pa

SCHEMA_VERSION = 1

LINK = pa.struct(
    [
        pa.field("trace_id", pa.string(), nullable=False),
        pa.field("span_id", pa.string(), nullable=False),
    ]
)

# (name, type, nullable, docstring)
COLUMNS = (
    ("trace_id", pa.string(), False, "The trace id: 32 lowercase hex digits."),
    ("span_id", pa.string(), False, "The span id: 16 lowercase hex digits."),
    (
        "parent_span_id",
        pa.string(),
        True,
        "The parent span's id (16 hex digits, same trace); null for a root span.",
    ),
    (
        "links",
        pa.list_(LINK),
        False,
        "The span's links (trace_id, span_id of each linked span, in order; empty list when "
        "none): a consumer's links name the producer spans that created its messages.",
    ),
    ("name", pa.string(), False, "The span's name, e.g. 'orders publish'."),
    (
        "kind",
        pa.string(),
        False,
        "The span kind, lowercase: unspecified, internal, server, client, producer, consumer "
        "(an unknown number is kept as its decimal text).",
    ),
    ("start_ns", pa.int64(), False, "Start time, nanoseconds since the Unix epoch (UTC)."),
    ("end_ns", pa.int64(), False, "End time, nanoseconds since the Unix epoch (UTC)."),
    (
        "status_code",
        pa.string(),
        False,
        "The span status, lowercase: unset, ok, error (an unknown number as its decimal text).",
    ),
    ("status_message", pa.string(), True, "The status message; null when empty."),
    ("service_name", pa.string(), True, "The resource's service.name."),
    (
        "service_instance",
        pa.string(),
        True,
        "The resource's service.instance.id, else its host.name.",
    ),
    ("scope_name", pa.string(), True, "The instrumentation scope's name (the library)."),
    (
        "messaging_system",
        pa.string(),
        True,
        "messaging.system (e.g. rabbitmq); null for a producer/consumer span without it.",
    ),
    (
        "operation",
        pa.string(),
        True,
        "The operation, in the current convention's values: create, send, receive, process, "
        "settle. From messaging.operation.type, else messaging.operation (old: publish -> send, "
        "deliver -> process), else read from messaging.operation.name, else from the kind "
        "(producer -> send, consumer -> process); another value is kept lowercase as given.",
    ),
    (
        "destination",
        pa.string(),
        True,
        "messaging.destination.name, else messaging.destination (old). On RabbitMQ the exchange "
        "('' for the default exchange).",
    ),
    (
        "routing_key",
        pa.string(),
        True,
        "messaging.rabbitmq.destination.routing_key, else messaging.rabbitmq.routing_key (old).",
    ),
    (
        "message_id",
        pa.string(),
        True,
        "messaging.message.id, else messaging.message_id (old); null when the span names none "
        "(the message is then known by its creation context: the producer span).",
    ),
    (
        "consumer_group",
        pa.string(),
        True,
        "messaging.consumer.group.name, else null: no older RabbitMQ attribute names a group "
        "(the destination is the exchange, not the queue), so the audit falls back to the "
        "consuming service_name.",
    ),
    (
        "conversation_id",
        pa.string(),
        True,
        "messaging.message.conversation_id, else messaging.conversation_id (old): the AMQP "
        "correlation id.",
    ),
    (
        "delivery_tag",
        pa.int64(),
        True,
        "messaging.rabbitmq.message.delivery_tag, when an integer (else null; the text stays in "
        "attributes).",
    ),
    (
        "attributes",
        pa.map_(pa.string(), pa.string()),
        False,
        "Every messaging.*, net.*, network.* and server.* span attribute, values as text: "
        "strings as they are, booleans true/false, integers and doubles in decimal, arrays and "
        "maps as JSON, bytes as lowercase hex.",
    ),
)

SPAN_SCHEMA = pa.schema(
    [
        pa.field(name, type_, nullable=nullable, metadata={"doc": doc})
        for name, type_, nullable, doc in COLUMNS
    ],
    metadata={"lazarus.spans.version": str(SCHEMA_VERSION)},
)

COLUMN_NAMES = tuple(name for name, *_ in COLUMNS)
