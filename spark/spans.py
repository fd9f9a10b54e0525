"""OpenTelemetry messaging spans -> the log contract's two frames, so the audit stays one pipeline.

The intake (``recovery/telemetry/``) keeps the messaging spans as Parquet rows of
``recovery/telemetry/schema.py`` under ``AUDIT_SPANS/dt=YYYY-MM-DD/hour=HH/`` (the hour of the
span's start). ``span_facts`` turns them into producer facts and consumer facts with exactly the
columns ``spark.schema.read_logs`` gives the log contract (``PRODUCER_LOG_SCHEMA`` /
``CONSUMER_LOG_SCHEMA`` + ``file_hour_ms`` and ``malformed``) plus ``source`` = ``"span"``
(``with_source`` adds ``"log"`` to the logs' frames), and ``merged`` unions them with the logs,
the log winning every fact both describe. Pure ``DataFrame -> DataFrame`` transforms; no UDFs.

The intake has already folded both conventions into its promoted columns: ``operation`` is the
current convention's value (``messaging.operation.type``; else the old ``messaging.operation``
with publish -> send and deliver -> process; else the span kind: producer -> send, consumer ->
process), ``destination`` is ``messaging.destination.name`` else ``messaging.destination``,
``routing_key`` ``messaging.rabbitmq.destination.routing_key`` else
``messaging.rabbitmq.routing_key``, ``message_id`` ``messaging.message.id`` else
``messaging.message_id``. The mapping (docs/audit.md "Traces from any service"):

producer fact  a ``create`` or ``send`` span (``publish`` in the old convention). producer =
               ``service.name``; exchange = destination (RabbitMQ instrumentations name the
               exchange, "" for the default one; opentelemetry-instrumentation-pika names the
               routing key there when the exchange is the default one); routing_key; message_id;
               ts = the span's start (ms); attempt = 1 (a message id a producer publishes again
               is its next attempt: the audit counts its lines); outcome = ``sent``: published,
               confirmation unknown (no instrumentation says whether the broker confirmed), or
               ``error`` when the span's status is error. A ``send`` span without a message id
               that links to other spans is a batch of the ``create`` spans it links to: the
               create spans are the facts, the batch is not one.
consumer fact  a ``receive`` or ``process`` span (``deliver`` in the old convention), or a
               ``settle`` span. consumer_group = ``messaging.consumer.group.name``, else the
               consuming ``service.name`` (no RabbitMQ instrumentation names the queue or a
               group: pika's and amqplib's ``destination`` on a consumer span is the exchange);
               consumer = service.name@service.instance.id (or the service alone); queue =
               ``messaging.destination.subscription.name`` when given, else null; redelivered =
               ``messaging.rabbitmq.message.redelivered`` when given, else false; outcome =
               ``delivered`` (received and handled, settlement unknown) for an ok/unset status,
               ``failed`` for an error status (received, outcome unknown: the handler failed,
               and the span cannot say whether the message was requeued, rejected to a
               dead-letter exchange or acked anyway); a ``settle`` span's
               ``messaging.operation.name`` gives the real outcome: ack -> ``ack``, reject ->
               ``reject``, nack/requeue -> ``requeue`` (any other: ``delivered``).
nesting        a messaging span whose parent is a messaging span of the same side and service
               says the same fact closer to the wire (pika wraps each publish in two ``send``
               spans, a ``process`` may be the child of its ``receive``, a ``settle`` the child of
               its ``process``): the child is the fact, its parent is dropped, and the child
               takes the parent's message id when it names none.
no message id  the message is known by its creation context: the producer span
               (trace_id, span_id) that created it. The producer fact's id is
               ``otel:<trace_id>:<span_id>`` of its own span; a consumer span's is that of its
               first link, else of its parent when the parent is a producer span, else (its
               parent is its own receive) of the parent's first link or parent. A consumer
               span with no id and no context cannot be matched: malformed.
malformed      a fact missing what the audit cannot go without (a producer span without a
               destination or service, a consumer span without a service): counted as a
               malformed line of its hour, never dropped silently.

What a span cannot prove is said as such: ``sent`` is never counted as confirmed nor as
unconfirmed, ``delivered`` never as an ack (a second delivery of it is a duplicate delivery),
``failed`` never as lost nor as handled (spark/transforms.py: ``sent``, ``received_unknown``).
"""

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark.schema import (
    CONSUMER_LOG_SCHEMA,
    HOUR_MS,
    LOG_PROVENANCE,
    PRODUCER_LOG_SCHEMA,
)

# What the audit reads of a span row (a subset of recovery/telemetry/schema.py's columns, read
# by name: the Parquet files may carry more).
SPAN_READ_SCHEMA = T.StructType(
    [
        T.StructField("trace_id", T.StringType()),
        T.StructField("span_id", T.StringType()),
        T.StructField("parent_span_id", T.StringType()),
        T.StructField(
            "links",
            T.ArrayType(
                T.StructType(
                    [
                        T.StructField("trace_id", T.StringType()),
                        T.StructField("span_id", T.StringType()),
                    ]
                )
            ),
        ),
        T.StructField("kind", T.StringType()),
        T.StructField("start_ns", T.LongType()),
        T.StructField("status_code", T.StringType()),
        T.StructField("service_name", T.StringType()),
        T.StructField("service_instance", T.StringType()),
        T.StructField("operation", T.StringType()),
        T.StructField("destination", T.StringType()),
        T.StructField("routing_key", T.StringType()),
        T.StructField("message_id", T.StringType()),
        T.StructField("consumer_group", T.StringType()),
        T.StructField("attributes", T.MapType(T.StringType(), T.StringType())),
    ]
)

PRODUCER_OPERATIONS = ("create", "send", "publish")
CONSUMER_OPERATIONS = ("receive", "process", "deliver", "settle")
# The outcomes spans add to the log contract's (they never appear in a log line).
SENT, DELIVERED, FAILED = "sent", "delivered", "failed"
SETTLE_OUTCOMES = {"ack": "ack", "reject": "reject", "nack": "requeue", "requeue": "requeue"}
SOURCES = ("log", "span", "trace")
SYNTHETIC_PREFIX = "otel:"


def _side() -> Column:
    operation = F.lower(F.col("operation"))
    return (
        F.when(operation.isin(*PRODUCER_OPERATIONS), F.lit("producer"))
        .when(operation.isin(*CONSUMER_OPERATIONS), F.lit("consumer"))
        .when(F.lower("kind") == "producer", F.lit("producer"))
        .when(F.lower("kind") == "consumer", F.lit("consumer"))
    )


def synthetic_id(trace_id: Column, span_id: Column) -> Column:
    """``otel:<trace_id>:<span_id>``: a message known by the producer span that created it."""
    return F.when(
        trace_id.isNotNull() & span_id.isNotNull(),
        F.concat(F.lit(SYNTHETIC_PREFIX), F.lower(trace_id), F.lit(":"), F.lower(span_id)),
    )


def _first_link() -> Column:
    return F.when(F.size("links") > 0, F.col("links")[0])


def messaging_spans(spans: DataFrame) -> DataFrame:
    """The span rows the audit reads, each with its ``side`` (producer | consumer), its parent's
    facts (``p_*``) when the parent is a span read too, and the nesting resolved: a span that
    is the parent of a span of its own side and service is dropped (the child is the fact)."""
    rows = spans.select(
        *[F.col(f.name) for f in SPAN_READ_SCHEMA.fields], _side().alias("side")
    ).where(F.col("side").isNotNull())
    parents = rows.select(
        F.col("trace_id").alias("p_trace_id"),
        F.col("span_id").alias("p_span_id"),
        F.col("side").alias("p_side"),
        F.col("service_name").alias("p_service"),
        F.col("message_id").alias("p_message_id"),
        F.col("parent_span_id").alias("p_parent_span_id"),
        _first_link().alias("p_link"),
    )
    joined = rows.join(
        parents,
        on=(F.col("trace_id") == F.col("p_trace_id"))
        & (F.col("parent_span_id") == F.col("p_span_id")),
        how="left",
    )
    nested = (F.col("p_side") == F.col("side")) & F.col("p_service").eqNullSafe(
        F.col("service_name")
    )
    joined = joined.withColumn("nested", F.coalesce(nested, F.lit(False)))
    outer = joined.where("nested").select(
        F.col("trace_id").alias("o_trace_id"), F.col("parent_span_id").alias("o_span_id")
    )
    return joined.join(
        outer,
        on=(F.col("trace_id") == F.col("o_trace_id")) & (F.col("span_id") == F.col("o_span_id")),
        how="left_anti",
    )


def _file_hour(ts: Column) -> Column:
    return ts - F.pmod(ts, F.lit(HOUR_MS))


def _id_of_message(side: str) -> Column:
    """The message's id: its own, its nesting parent's, else its creation context."""
    own = F.coalesce(F.col("message_id"), F.when(F.col("nested"), F.col("p_message_id")))
    if side == "producer":
        return F.coalesce(own, synthetic_id(F.col("trace_id"), F.col("span_id")))
    link = _first_link()
    return F.coalesce(
        own,
        synthetic_id(link["trace_id"], link["span_id"]),
        F.when(F.col("p_side") == "producer", synthetic_id(F.col("trace_id"), F.col("p_span_id"))),
        F.when(
            F.col("nested"),
            F.coalesce(
                synthetic_id(F.col("p_link.trace_id"), F.col("p_link.span_id")),
                synthetic_id(F.col("trace_id"), F.col("p_parent_span_id")),
            ),
        ),
        # the parent is no span the intake kept: the producer span the context names
        F.when(F.col("p_side").isNull(), synthetic_id(F.col("trace_id"), F.col("parent_span_id"))),
    )


def _attribute(name: str) -> Column:
    return F.col("attributes").getItem(name)


def _ms(ns: Column) -> Column:
    return F.floor(ns / 1_000_000).cast("long")


def span_facts(spans: DataFrame) -> tuple[DataFrame, DataFrame]:
    """Span rows -> (producer facts, consumer facts) with the columns of ``read_logs``'
    frames plus ``source`` = ``span`` (the mapping: this module's docstring)."""
    return facts_of(messaging_spans(spans))


def facts_of(rows: DataFrame) -> tuple[DataFrame, DataFrame]:
    """``messaging_spans`` rows -> (producer facts, consumer facts)."""
    ts = _ms(F.col("start_ns"))
    error = F.lower("status_code") == "error"
    batch = (F.lower("operation") == "send") & F.col("message_id").isNull() & (F.size("links") > 0)
    producers = rows.where((F.col("side") == "producer") & ~batch).select(
        F.lit(1).cast("long").alias("v"),
        ts.alias("ts"),
        F.col("service_name").alias("producer"),
        _id_of_message("producer").alias("message_id"),
        F.col("destination").alias("exchange"),
        F.col("routing_key"),
        F.lit(1).cast("long").alias("attempt"),
        F.when(error, F.lit("error")).otherwise(F.lit(SENT)).alias("outcome"),
        F.lit(None).cast("long").alias("confirm_ms"),
        F.lit(None).cast("long").alias("size"),
        _file_hour(ts).alias("file_hour_ms"),
        (
            F.col("service_name").isNull()
            | F.col("destination").isNull()
            | F.col("start_ns").isNull()
        ).alias("malformed"),
        F.lit("span").alias("source"),
    )
    settled = F.lower(_attribute("messaging.operation.name"))
    outcome = F.when(error, F.lit(FAILED)).otherwise(F.lit(DELIVERED))
    for said, meant in SETTLE_OUTCOMES.items():
        outcome = F.when(
            (F.lower("operation") == "settle") & (settled == said), F.lit(meant)
        ).otherwise(outcome)
    message_id = _id_of_message("consumer")
    consumers = rows.where(F.col("side") == "consumer").select(
        F.lit(1).cast("long").alias("v"),
        ts.alias("ts"),
        F.coalesce("consumer_group", "service_name").alias("consumer_group"),
        F.when(
            F.col("service_instance").isNotNull(),
            F.concat_ws("@", "service_name", "service_instance"),
        )
        .otherwise(F.col("service_name"))
        .alias("consumer"),
        _attribute("messaging.destination.subscription.name").alias("queue"),
        message_id.alias("message_id"),
        F.coalesce(
            F.lower(_attribute("messaging.rabbitmq.message.redelivered")) == "true", F.lit(False)
        ).alias("redelivered"),
        outcome.alias("outcome"),
        F.lit(None).cast("long").alias("handle_ms"),
        _file_hour(ts).alias("file_hour_ms"),
        (F.col("service_name").isNull() | message_id.isNull() | F.col("start_ns").isNull()).alias(
            "malformed"
        ),
        F.lit("span").alias("source"),
    )
    return producers, consumers


def with_source(logs: DataFrame, source: str = "log") -> DataFrame:
    """A ``read_logs`` frame with its ``source`` column."""
    return logs.withColumn("source", F.lit(source))


def merged(logs: DataFrame, spans: DataFrame, keys: tuple[str, ...]) -> DataFrame:
    """The log's lines and the span facts no log line describes: the log wins (it knows
    confirms and acks), and a message with both is never counted twice. ``keys``: what makes
    two rows one fact (producer: the message id; consumer: the message id and group)."""
    return strongest_first([with_source(logs), spans], keys)


def strongest_first(frames: list[DataFrame], keys: tuple[str, ...]) -> DataFrame:
    """Every fact of ``frames[0]``, then each next frame's facts that no stronger frame's
    valid row describes (``keys``): the strongest source wins each fact, none counts twice.
    The audit's order: producer log > broker trace > span (a span cannot say the broker took
    the message), consumer log > span > trace (an ack beats a delivery)."""
    out = frames[0]
    seen = frames[0].where(~F.col("malformed")).select(*keys)
    for frame in frames[1:]:
        kept = frame.join(seen.distinct(), on=list(keys), how="left_anti")
        out = out.unionByName(kept)
        seen = seen.unionByName(kept.where(~F.col("malformed")).select(*keys))
    return out


def empty_span_frames(spark) -> tuple[DataFrame, DataFrame]:
    """(producer, consumer) facts of no span: the schemas ``span_facts`` returns."""
    source = T.StructField("source", T.StringType())
    return tuple(
        spark.createDataFrame([], T.StructType([*schema.fields, *LOG_PROVENANCE.fields, source]))
        for schema in (PRODUCER_LOG_SCHEMA, CONSUMER_LOG_SCHEMA)
    )
