"""RabbitMQ's firehose records -> the log contract's two frames and the broker's own expectations.

The tap (``recovery/broker/trace_tap.py``) keeps one record per trace message as Parquet rows
of ``recovery.broker.trace.trace_schema`` under ``AUDIT_TRACE/dt=YYYY-MM-DD/hour=HH/`` (the hour
the tap received it). ``trace_facts`` turns them into producer and consumer facts with the
columns ``spark.schema.read_logs`` gives the log contract, plus ``source`` = ``"trace"``, and
``routes``: per publish, the consumer groups the broker routed it to. Pure
``DataFrame -> DataFrame`` transforms; no UDFs. The mapping (docs/audit.md "The broker as a
witness"):

identity      a record's ``message_id`` property, else ``trace:<sha256 of the body, 32 hex>``
              (``body_sha``): the firehose carries the body, so a publish and its deliveries
              share it. Two messages with byte-identical bodies and no id are one message to
              the audit (its second publish is a second attempt). A record with neither is
              malformed, counted in its hour.
producer fact a ``publish.<exchange>`` record. producer = ``broker:<user>`` (the broker knows
              the connection's user, not the service); exchange; routing_key = the first of
              ``routing_keys``; outcome = ``ack``: the broker routed it (the firehose fires once
              the exchange has routed the message, after any alternate exchange): as good as a
              confirm for the audit, which the log contract's ack line is too. A log line of the
              same message wins (it knows the real confirm); the trace wins over a span
              (``sent``: a span cannot say the broker took it). Duplicate records (a tap's replay
              after a crash) are dropped by ``key``.
consumer fact a ``deliver.<queue>`` record. consumer_group = the group the bindings name for the
              queue, else the queue's own name; consumer = ``broker:<user>``; queue; redelivered;
              outcome = ``delivered`` (received; settlement unknown: the firehose does not trace
              acks). A log line or span of the same (message, group) wins (an ack beats a
              delivery).
routes        the groups of a publish's ``routed_queues`` (mapped as above), sorted; a publish
              routed to no queue (no binding matched and no alternate exchange) is expected by
              ``UNROUTED_GROUP``, which never consumes: the audit names it lost (or, when the
              store holds it, recoverable). These become ``traced`` expectations
              (``traced_expectations``), which replace the bindings' for every traced key.
ignored       Lazarus's own queues (the dead-letter, unrouted, returns, quarantine, parked and
              trace queues: ``ignored_queues``) are neither an expectation nor a delivery: the
              collector's deliveries from them are Lazarus's own reads, not the consumers'.

What the firehose cannot say (so the audit must not read its silence): dead-letter re-publishes
are not traced (the store says what was dead-lettered); a record lost while no tap ran, a node
restarted or a stream's retention dropped it: a ``trace_gap`` (computed by
``recovery.broker.trace.coverage_gaps`` from the tap's coverage records and given to the audit:
the traced groups' pairs of the windows it touches are ``unverified``).
"""

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark.expectations import SPAN_END, SPAN_START, Expectation
from spark.schema import HOUR_MS

TRACE_READ_SCHEMA = T.StructType(
    [
        T.StructField("key", T.StringType()),
        T.StructField("kind", T.StringType()),
        T.StructField("ts_ms", T.LongType()),
        T.StructField("exchange", T.StringType()),
        T.StructField("routing_keys", T.ArrayType(T.StringType())),
        T.StructField("routed_queues", T.ArrayType(T.StringType())),
        T.StructField("queue", T.StringType()),
        T.StructField("redelivered", T.BooleanType()),
        T.StructField("message_id", T.StringType()),
        T.StructField("user", T.StringType()),
        T.StructField("body_size", T.LongType()),
        T.StructField("body_sha", T.StringType()),
    ]
)

# The group that expects a publish the broker routed to no queue: nobody consumes for it.
UNROUTED_GROUP = "(routed to no queue)"
SYNTHETIC_PREFIX = "trace:"
DELIVERED = "delivered"


def _group_of(queue: Column, queue_groups: dict[str, str]) -> Column:
    if not queue_groups:
        return queue
    mapping = F.create_map(*[F.lit(x) for pair in sorted(queue_groups.items()) for x in pair])
    return F.coalesce(mapping[queue], queue)


def _message_id() -> Column:
    return F.coalesce(
        F.col("message_id"),
        F.when(F.col("body_sha").isNotNull(), F.concat(F.lit(SYNTHETIC_PREFIX), "body_sha")),
    )


def _file_hour(ts: Column) -> Column:
    return ts - F.pmod(ts, F.lit(HOUR_MS))


def trace_facts(
    records: DataFrame, queue_groups: dict[str, str], ignored_queues=()
) -> tuple[DataFrame, DataFrame, DataFrame]:
    """Trace records -> (producer facts, consumer facts, routes) (this module's docstring).
    ``queue_groups``: queue -> consumer group (the bindings' and the consumer logs' pairs);
    ``ignored_queues``: Lazarus's own queues."""
    rows = records.dropDuplicates(["key"])
    ignored = [F.lit(q) for q in sorted(set(ignored_queues))]
    message_id = _message_id()
    ts = F.col("ts_ms")
    publishes = rows.where(F.col("kind") == "publish")
    producers = publishes.select(
        F.lit(1).cast("long").alias("v"),
        ts.alias("ts"),
        F.concat(F.lit("broker:"), F.coalesce("user", F.lit("?"))).alias("producer"),
        message_id.alias("message_id"),
        F.col("exchange"),
        F.col("routing_keys")[0].alias("routing_key"),
        F.lit(1).cast("long").alias("attempt"),
        F.lit("ack").alias("outcome"),
        F.lit(None).cast("long").alias("confirm_ms"),
        F.col("body_size").alias("size"),
        _file_hour(ts).alias("file_hour_ms"),
        (message_id.isNull() | ts.isNull() | F.col("exchange").isNull()).alias("malformed"),
        F.lit("trace").alias("source"),
    )
    routed = F.filter(
        F.coalesce("routed_queues", F.array().cast("array<string>")),
        lambda q: ~q.isin(*ignored) if ignored else F.lit(True),
    )
    groups = F.array_sort(
        F.array_distinct(F.transform(routed, lambda q: _group_of(q, queue_groups)))
    )
    routes = publishes.where(message_id.isNotNull() & ts.isNotNull()).select(
        F.col("exchange"),
        F.coalesce(F.col("routing_keys")[0], F.lit("")).alias("routing_key"),
        ts.alias("ts"),
        F.when(F.size(groups) > 0, groups)
        .otherwise(F.array(F.lit(UNROUTED_GROUP)))
        .alias("groups"),
    )
    deliveries = rows.where(F.col("kind") == "deliver")
    if ignored:
        deliveries = deliveries.where(~F.col("queue").isin(*ignored))
    consumers = deliveries.select(
        F.lit(1).cast("long").alias("v"),
        ts.alias("ts"),
        _group_of(F.col("queue"), queue_groups).alias("consumer_group"),
        F.concat(F.lit("broker:"), F.coalesce("user", F.lit("?"))).alias("consumer"),
        F.col("queue"),
        message_id.alias("message_id"),
        F.coalesce("redelivered", F.lit(False)).alias("redelivered"),
        F.lit(DELIVERED).alias("outcome"),
        F.lit(None).cast("long").alias("handle_ms"),
        _file_hour(ts).alias("file_hour_ms"),
        (message_id.isNull() | ts.isNull() | F.col("queue").isNull()).alias("malformed"),
        F.lit("trace").alias("source"),
    )
    return producers, consumers, routes


def route_runs(routes: DataFrame) -> list[tuple]:
    """(exchange, routing_key, groups, first_ms) of every run of publishes of a key the broker
    routed to the same groups, in time order: a few rows per key, collected.

    One aggregate per (key, groups) gives each set's first and last publish; where those spans
    of a key do not overlap (bindings did not flap back and forth) they are its runs. Keys whose
    spans overlap take the exact path: every change of set, from a window over their
    publishes."""
    spans = (
        routes.groupBy("exchange", "routing_key", "groups")
        .agg(F.min("ts").alias("first_ms"), F.max("ts").alias("last_ms"))
        .collect()
    )
    by_key: dict[tuple, list] = {}
    for row in spans:
        by_key.setdefault((row.exchange, row.routing_key), []).append(
            (row.first_ms, row.last_ms, tuple(row.groups))
        )
    runs, flapping = [], []
    for key, sets in sorted(by_key.items()):
        sets.sort()
        if any(nxt[0] <= cur[1] for cur, nxt in zip(sets, sets[1:], strict=False)):
            flapping.append(key)
            continue
        runs += [(*key, groups, first) for first, _, groups in sets]
    if flapping:
        from pyspark.sql import Window

        keys = routes.sparkSession.createDataFrame(flapping, "exchange string, routing_key string")
        ordered = Window.partitionBy("exchange", "routing_key").orderBy("ts")
        changes = (
            routes.join(F.broadcast(keys), on=["exchange", "routing_key"])
            .withColumn("previous", F.lag("groups").over(ordered))
            .where(F.col("previous").isNull() | (F.col("previous") != F.col("groups")))
            .select("exchange", "routing_key", "groups", "ts")
            .collect()
        )
        runs += [(r.exchange, r.routing_key, tuple(r.groups), r.ts) for r in changes]
    return sorted(runs, key=lambda r: (r[0], r[1], r[3]))


def traced_expectations(runs: list[tuple], queue_of: dict[str, str] | None = None):
    """``route_runs`` -> ``traced`` expectations: each run's groups from its first publish to
    the next run's (the first run from the start of time, the last to its end: the broker's
    routing holds until it is seen to change)."""
    queue_of = queue_of or {}
    out = []
    for i, (exchange, routing_key, groups, first) in enumerate(runs):
        same_key = i > 0 and runs[i - 1][:2] == (exchange, routing_key)
        nxt = runs[i + 1] if i + 1 < len(runs) else None
        until = nxt[3] if nxt is not None and nxt[:2] == (exchange, routing_key) else SPAN_END
        start = first if same_key else SPAN_START
        out += [
            Expectation(
                exchange,
                routing_key,
                group,
                queue_of.get(group, group),
                "traced",
                start,
                until,
                exact=True,
            )
            for group in groups
        ]
    return out
