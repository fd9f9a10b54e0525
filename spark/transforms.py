"""Reconciliation facts: producer logs x consumer logs x store -> one row per (message, group).

Every function here is a pure ``DataFrame -> DataFrame`` transform; ``spark/metrics.py`` rolls the
facts up into windows, totals and evidence. Times are epoch milliseconds (UTC) until the output.

Definitions (the audit's contract, DESIGN.md "Audit metrics")
------------------------------------------------------------
message      a ``message_id`` seen in the producer logs. Its window is the UTC hour of its FIRST
             publish attempt (smallest ``ts``; ties by ``attempt``); its exchange and routing key
             are those of that attempt. Attempts logged before the audited day (the look-back
             read for this) keep a message out of the day; attempts logged in the grace period
             after the day still count as its retries.
publish state  exactly one per message, so the four sum to ``distinct_published``:
             ``confirmed`` if any attempt was acked, else ``returned`` if any was returned, else
             ``nacked`` if any was nacked, else ``unconfirmed`` (timeout/error only).
pair         (message, consumer group) for every group the bindings snapshot expects the message to
             reach (exchange equal, routing key matching the topic pattern) and every group that
             logged a delivery of it. A message with neither gets one pair with a null group.
             Producer-side metrics of a window row count the messages of its pairs, so a fanout
             message counts once in each group's row; ``totals`` count every message once.
delivery     a consumer-log line of that group for that message with ``ts < window end + grace``
             (its deadline). Lines after the deadline are ``late_deliveries`` and count for nothing
             else: a FINAL window must not change when later logs arrive.
consumed     the pair has a delivery with outcome ``ack`` or ``duplicate_skipped`` (the consumer's
             dedup store proves an earlier handling). ``delivered_unique`` counts consumed pairs.
latency      first consuming delivery ``ts`` - first publish ``ts``. Negative values are
             ``clock_skew`` and are left out of p50/p95/p99/max and of ``within_sla_share``
             (share of the non-negative latencies <= the SLA).
store rows   recovery-store rows with the pair's ``message_id``. A ``dead_letter`` row covers the
             group(s) its ``source_queue`` belongs to (bindings' optional ``queue`` or the
             consumer logs' queue/group pairs), or every group when the queue is unknown.
             ``returned|unroutable|nacked|unconfirmed`` rows are producer-side: they cover every
             group.
dead_lettered  pairs covered by a ``dead_letter`` row; by reason (``rejected|expired|maxlen|
             delivery_limit``) of the earliest such row, so the reasons sum to ``dead_lettered``.
recovered    dead-lettered pairs whose rows were replayed (``replay_count > 0``) and that were
             consumed at or after the dead letter was collected.
unaccounted  expected pairs of a confirmed message that were not consumed and that no store row
             covers. In a FINAL window they are ``lost`` unless the window has an input gap, then
             ``unverified``; in a PROVISIONAL window they are ``pending``. ``loss_ppm`` =
             lost x 1e6 / ``expected_confirmed`` (expected pairs of confirmed messages), FINAL only.
duplicates   extra = deliveries - 1 (when positive), attributed in this order:
             ``dup_broker_redelivery`` = extra deliveries flagged ``redelivered=true``;
             replays = deliveries the store's ``replay_count`` explains (recovery, NOT a duplicate);
             ``dup_producer_retry`` = up to (attempts - 1) of the remaining unflagged ones: the
             broker got several copies from the producer's retries;
             ``dup_consumer_reprocessing`` = the rest (handled again without broker or producer
             cause). ``dup_deliveries`` is their sum; ``dup_msgs`` counts pairs with any.
orphan       a consumer-log line of the audited day whose ``message_id`` is in neither the producer
             logs read nor the store: the producer logs have a gap. Counted per line
             (``orphan_consumptions``) in the window of the line's own ``ts``.
input gap    an hour with no log file from a process (producer, or consumer of a group) that had a
             file in the previous hour and has one again later (a hole, not a shutdown). A
             producer gap puts its window "in gap"; a consumer gap of group G at hour H puts G's
             pairs of every window whose deadline passes H in gap.
malformed    a line that does not parse against the schema, lacks a required field or has an
             unknown schema version; counted in the window of the file's ``dt``/``hour``.
"""

# How the job computes it (not part of the contract above): producer lines, consumer lines and
# store rows are shuffled ONCE, by message_id, and folded into one row per message in a single
# aggregate (``per_message``); the pairs and the orphan lines come out of that row by a narrow
# explode (``pair_and_orphan_rows``). Everything else the audit needs from the logs (process
# hours, malformed lines, routing keys, queues) comes from one small aggregate per log
# (``log_summary``), small enough to collect on the driver.

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark.schema import HOUR_MS

CONSUMED_OUTCOMES = ("ack", "duplicate_skipped")
PRODUCER_SIDE_KINDS = ("returned", "unroutable", "nacked", "unconfirmed")
DEAD_LETTER_REASONS = ("rejected", "expired", "maxlen", "delivery_limit")

# Where a row of ``audit_lines`` comes from.
PRODUCER_LINE, CONSUMER_LINE, STORE_ROW = 0, 1, 2

STORE_ROW_TYPE = T.StructType(
    [
        T.StructField("collected_ms", T.LongType()),
        T.StructField("id", T.LongType()),
        T.StructField("kind", T.StringType()),
        T.StructField("reason", T.StringType()),
        T.StructField("replay_count", T.LongType()),
        T.StructField("covered_group", T.StringType()),
    ]
)

# One exploded row of ``pair_and_orphan_rows``: a pair's delivery counts, or an orphan line.
PAIR_TYPE = T.StructType(
    [
        T.StructField("consumer_group", T.StringType()),
        T.StructField("deliveries", T.LongType()),
        T.StructField("redelivered", T.LongType()),
        T.StructField("late_deliveries", T.LongType()),
        T.StructField("first_consumed_ts", T.LongType()),
        T.StructField("last_consumed_ts", T.LongType()),
        T.StructField("consumer", T.StringType()),
        T.StructField("line_ts", T.LongType()),
    ]
)


def valid_lines(logs: DataFrame) -> DataFrame:
    return logs.where(~F.col("malformed"))


def log_summary(logs: DataFrame, process: str, *keys: Column) -> DataFrame:
    """Line counts per (process, file hour, malformed, keys...): all the audit needs from a log
    besides its lines. As small as processes x hours x keys, so the driver can hold it."""
    return logs.groupBy(F.col(process).alias("process"), "file_hour_ms", "malformed", *keys).agg(
        F.count(F.lit(1)).alias("lines")
    )


def published_keys(producer_summary: DataFrame) -> DataFrame:
    """Every (exchange, routing_key) of a valid producer line (a superset of first attempts')."""
    return producer_summary.where(~F.col("malformed")).select("exchange", "routing_key").distinct()


def expected_groups(keys: DataFrame, bindings: DataFrame) -> DataFrame:
    """(exchange, routing_key) -> sorted array of the consumer groups bound to receive it.

    Matches the distinct keys only, so the regex join stays as small as the key space.
    """
    matched = keys.join(
        F.broadcast(bindings.select("exchange", "pattern_regex", "consumer_group")),
        on=[
            keys["exchange"] == bindings["exchange"],
            F.regexp_like(keys["routing_key"], bindings["pattern_regex"]),
        ],
        how="inner",
    )
    return matched.groupBy(keys["exchange"], keys["routing_key"]).agg(
        F.array_sort(F.collect_set("consumer_group")).alias("expected_groups")
    )


def queue_groups(consumer_summary: DataFrame, bindings: DataFrame) -> DataFrame:
    """The set of (queue, consumer_group) pairs known from the consumer logs and the bindings."""
    logged = consumer_summary.where(~F.col("malformed") & F.col("queue").isNotNull()).select(
        "queue", "consumer_group"
    )
    configured = bindings.where(F.col("queue").isNotNull()).select("queue", "consumer_group")
    return logged.unionByName(configured).distinct()


def store_rows(store: DataFrame, queue_group: DataFrame) -> DataFrame:
    """(message_id, store_row): each store row once per group its source queue belongs to."""
    rows = store.where(F.col("message_id").isNotNull()).join(
        F.broadcast(queue_group.withColumnRenamed("queue", "source_queue")),
        on="source_queue",
        how="left",
    )
    covered = F.when(F.col("kind") == "dead_letter", F.col("consumer_group"))
    row = F.struct(
        (F.unix_micros("collected_at") / 1000).cast("long").alias("collected_ms"),
        F.col("id").alias("id"),
        F.col("kind").alias("kind"),
        F.col("reason").alias("reason"),
        F.coalesce("replay_count", F.lit(0).cast("long")).alias("replay_count"),
        covered.alias("covered_group"),
    )
    return rows.select("message_id", row.alias("store_row"))


def audit_lines(
    producer_lines: DataFrame, consumer_lines: DataFrame, stored: DataFrame
) -> DataFrame:
    """Producer lines, consumer lines and store rows in one frame, tagged by ``source``."""
    none = {
        "ts": T.LongType(),
        "attempt": T.LongType(),
        "exchange": T.StringType(),
        "routing_key": T.StringType(),
        "outcome": T.StringType(),
        "consumer_group": T.StringType(),
        "consumer": T.StringType(),
        "redelivered": T.BooleanType(),
        "store_row": STORE_ROW_TYPE,
    }

    def tagged(frame: DataFrame, source: int) -> DataFrame:
        return frame.select(
            "message_id",
            F.lit(source).cast("byte").alias("source"),
            *[
                F.col(name) if name in frame.columns else F.lit(None).cast(kind).alias(name)
                for name, kind in none.items()
            ],
        )

    return (
        tagged(producer_lines, PRODUCER_LINE)
        .unionByName(tagged(consumer_lines, CONSUMER_LINE))
        .unionByName(tagged(stored, STORE_ROW))
    )


def per_message(lines: DataFrame) -> DataFrame:
    """One row per message_id of ``audit_lines``: its publish facts, its consumer lines, its store
    rows, and the consumer-line summary ``pair_and_orphan_rows`` needs for the common case.

    The repartition is the job's only shuffle of the lines; the aggregate runs in one phase on it.
    """
    source = F.col("source")
    produced = source == PRODUCER_LINE
    consumed = source == CONSUMER_LINE
    consuming = consumed & F.col("outcome").isin(*CONSUMED_OUTCOMES)
    first = F.when(produced, F.struct("ts", "attempt"))
    key = F.struct("exchange", F.coalesce("routing_key", F.lit("")).alias("routing_key"))
    line = F.struct("consumer_group", "consumer", "ts", "redelivered", "outcome")
    facts = (
        lines.repartition("message_id")
        .groupBy("message_id")
        .agg(
            F.min(F.when(produced, F.col("ts"))).alias("first_ts"),
            F.min_by(F.when(produced, key), first).alias("key"),
            F.count_if(produced).alias("attempts"),
            *[
                F.count_if(produced & (F.col("outcome") == outcome)).alias(f"{outcome}_lines")
                for outcome in ("ack", "returned", "nack")
            ],
            F.collect_list(F.when(consumed, line)).alias("lines"),
            F.count_if(consumed).alias("line_count"),
            F.min(F.when(consumed, F.col("consumer_group"))).alias("min_group"),
            F.max(F.when(consumed, F.col("consumer_group"))).alias("max_group"),
            F.min(F.when(consumed, F.col("ts"))).alias("min_line_ts"),
            F.max(F.when(consumed, F.col("ts"))).alias("max_line_ts"),
            F.count_if(consumed & F.coalesce("redelivered", F.lit(False))).alias("redelivered"),
            F.min(F.when(consuming, F.col("ts"))).alias("min_consuming_ts"),
            F.max(F.when(consuming, F.col("ts"))).alias("max_consuming_ts"),
            F.collect_list("store_row").alias("store_rows"),
            F.min("store_row.id").alias("store_id"),
        )
    )
    state = (
        F.when(F.col("ack_lines") > 0, "confirmed")
        .when(F.col("returned_lines") > 0, "returned")
        .when(F.col("nack_lines") > 0, "nacked")
        .otherwise("unconfirmed")
    )
    return facts.select(
        "message_id",
        "first_ts",
        (F.floor(F.col("first_ts") / HOUR_MS) * HOUR_MS).cast("long").alias("window_ms"),
        F.col("key.exchange").alias("exchange"),
        F.col("key.routing_key").alias("routing_key"),
        "attempts",
        state.alias("publish_state"),
        "lines",
        "line_count",
        "min_group",
        "max_group",
        "min_line_ts",
        "max_line_ts",
        "redelivered",
        "min_consuming_ts",
        "max_consuming_ts",
        "store_rows",
        "store_id",
    )


def with_expected_groups(messages: DataFrame, expected: DataFrame) -> DataFrame:
    """Adds ``expected_groups`` (empty when no binding matches)."""
    return messages.join(
        F.broadcast(expected), on=["exchange", "routing_key"], how="left"
    ).withColumn("expected_groups", F.coalesce("expected_groups", F.array().cast("array<string>")))


def _pair(
    group: Column,
    deliveries: Column | int = 0,
    redelivered: Column | int = 0,
    late: Column | int = 0,
    first_consumed: Column | None = None,
    last_consumed: Column | None = None,
    consumer: Column | None = None,
    line_ts: Column | None = None,
) -> Column:
    def value(column, kind):
        column = F.lit(column) if not isinstance(column, Column) else column
        return column.cast(kind)

    fields = (
        group,
        deliveries,
        redelivered,
        late,
        first_consumed,
        last_consumed,
        consumer,
        line_ts,
    )
    return F.struct(
        *[
            value(column, field.dataType).alias(field.name)
            for column, field in zip(fields, PAIR_TYPE.fields, strict=True)
        ]
    )


def _no_pairs() -> Column:
    return F.array().cast(T.ArrayType(PAIR_TYPE))


def _seen_pairs(deadline: Column) -> tuple[Column, Column]:
    """(pairs of the groups that logged a line, those groups). Each line counts as a delivery
    when ``ts < deadline``, else as a late delivery.

    Most messages have lines of one group only, all on time (or all late): their pair comes from
    the aggregate's summary columns. Only the others go through the array functions.
    """
    on_time_all = F.col("max_line_ts") < deadline
    uniform = (F.col("line_count") == 0) | (
        (F.col("min_group") == F.col("max_group"))
        & (on_time_all | (F.col("min_line_ts") >= deadline))
    )
    summary = _pair(
        F.col("min_group"),
        F.when(on_time_all, F.col("line_count")).otherwise(0),
        F.when(on_time_all, F.col("redelivered")).otherwise(0),
        F.when(on_time_all, 0).otherwise(F.col("line_count")),
        F.when(on_time_all, F.col("min_consuming_ts")),
        F.when(on_time_all, F.col("max_consuming_ts")),
    )
    groups = F.array_distinct(F.transform("lines", lambda line: line["consumer_group"]))

    def group_pair(group: Column) -> Column:
        mine = F.filter("lines", lambda line: line["consumer_group"] == group)
        on_time = F.filter(mine, lambda line: line["ts"] < deadline)
        consuming = F.transform(
            F.filter(on_time, lambda line: line["outcome"].isin(*CONSUMED_OUTCOMES)),
            lambda line: line["ts"],
        )
        redelivered = F.filter(on_time, lambda line: F.coalesce(line["redelivered"], F.lit(False)))
        return _pair(
            group,
            F.size(on_time),
            F.size(redelivered),
            F.size(mine) - F.size(on_time),
            F.array_min(consuming),
            F.array_max(consuming),
        )

    some = F.col("line_count") > 0
    pairs = F.when(uniform & some, F.array(summary)).when(uniform, _no_pairs())
    names = F.when(uniform & some, F.array("min_group")).when(
        uniform, F.array().cast("array<string>")
    )
    return (
        pairs.otherwise(F.transform(groups, group_pair)),
        names.otherwise(groups),
    )


def pair_and_orphan_rows(messages: DataFrame, day_start_ms: int, grace_ms: int) -> DataFrame:
    """One row per (message, group) of the audited day's messages, and one per orphan line.

    Pairs: the groups that logged a line, then the expected groups that did not (``primary``
    marks one pair per message); a message with neither gets one pair with a null group.
    Orphan rows (``orphan``) are the day's lines of a message_id no producer line or store row
    knows, in the window of the line's own ``ts``.
    """
    day_end_ms = day_start_ms + 24 * HOUR_MS
    deadline = F.col("window_ms") + HOUR_MS + grace_ms
    in_day = (F.col("window_ms") >= day_start_ms) & (F.col("window_ms") < day_end_ms)
    orphan = F.col("first_ts").isNull() & F.col("store_id").isNull()
    seen, seen_groups = _seen_pairs(deadline)
    missing = F.array_except("expected_groups", seen_groups)
    silent = F.when(F.size(missing) == 0, _no_pairs()).otherwise(
        F.transform(missing, lambda group: _pair(group))
    )
    every = F.concat(seen, silent)
    nobody = F.array(_pair(F.lit(None)))
    orphan_lines = F.transform(
        F.filter("lines", lambda line: (line["ts"] >= day_start_ms) & (line["ts"] < day_end_ms)),
        lambda line: _pair(line["consumer_group"], consumer=line["consumer"], line_ts=line["ts"]),
    )
    rows = F.when(in_day, F.when(F.size(every) > 0, every).otherwise(nobody)).otherwise(
        orphan_lines
    )
    exploded = messages.where(in_day | orphan).select(
        "*", orphan.alias("orphan"), F.posexplode(rows).alias("pair_index", "p")
    )
    return exploded.select(
        "message_id",
        F.when(F.col("orphan"), (F.floor(F.col("p.line_ts") / HOUR_MS) * HOUR_MS).cast("long"))
        .otherwise(F.col("window_ms"))
        .alias("window_ms"),
        "first_ts",
        "exchange",
        "routing_key",
        "attempts",
        "publish_state",
        "expected_groups",
        "store_rows",
        "store_id",
        "orphan",
        (~F.col("orphan") & (F.col("pair_index") == 0)).alias("primary"),
        "p.*",
    )


def classify_pairs(pairs: DataFrame) -> DataFrame:
    """Per pair: expected, consumed, dead-lettered, recovered, unaccounted, duplicates by cause.

    Store rows are few: a pair without any skips the array functions.
    """
    group = F.col("consumer_group")

    def covers(row: Column) -> Column:
        return row["covered_group"].isNull() | (row["covered_group"] == group)

    stored = F.size("store_rows") > 0
    no_rows = F.array().cast(T.ArrayType(STORE_ROW_TYPE))
    with_rows = pairs.withColumns(
        {
            "dead_letters": F.when(
                stored,
                F.filter("store_rows", lambda s: (s["kind"] == "dead_letter") & covers(s)),
            ).otherwise(no_rows),
            "covered": stored & F.exists("store_rows", covers),
        }
    )
    dead_letters = F.col("dead_letters")
    dead_lettered = F.size(dead_letters) > 0
    first_dead_letter = F.array_min(dead_letters)
    replays = F.when(
        dead_lettered,
        F.aggregate(dead_letters, F.lit(0).cast("long"), lambda acc, s: acc + s["replay_count"]),
    ).otherwise(0)
    consumed = F.col("first_consumed_ts").isNotNull()
    extra = F.greatest(F.col("deliveries") - 1, F.lit(0))
    by_broker = F.least(F.col("redelivered"), extra)
    by_replay = F.least(extra - by_broker, replays)
    unflagged = extra - by_broker - by_replay
    by_retry = F.least(unflagged, F.col("attempts") - 1)
    expected = group.isNotNull() & F.array_contains("expected_groups", group)
    return with_rows.select(
        "message_id",
        "window_ms",
        "exchange",
        "routing_key",
        "consumer_group",
        "primary",
        "attempts",
        "publish_state",
        "store_id",
        expected.alias("expected"),
        "deliveries",
        "late_deliveries",
        consumed.alias("consumed"),
        (F.col("first_consumed_ts") - F.col("first_ts")).alias("latency_ms"),
        dead_lettered.alias("dead_lettered"),
        F.when(dead_lettered, first_dead_letter["reason"]).alias("dead_letter_reason"),
        (
            dead_lettered
            & (replays > 0)
            & consumed
            & (F.col("last_consumed_ts") >= first_dead_letter["collected_ms"])
        ).alias("recovered"),
        (expected & (F.col("publish_state") == "confirmed") & ~consumed & ~F.col("covered")).alias(
            "unaccounted"
        ),
        by_broker.alias("dup_broker_redelivery"),
        by_retry.alias("dup_producer_retry"),
        (unflagged - by_retry).alias("dup_consumer_reprocessing"),
        "orphan",
        "consumer",
        "line_ts",
    )


def process_hours(summary: DataFrame, source: str) -> DataFrame:
    """(source, process, consumer_group, hour_ms) for every hour a process wrote a log file."""
    group = F.col("consumer_group") if "consumer_group" in summary.columns else F.lit(None)
    return (
        summary.where(F.col("process").isNotNull())
        .select(
            F.lit(source).alias("source"),
            "process",
            group.cast("string").alias("consumer_group"),
            F.col("file_hour_ms").alias("hour_ms"),
        )
        .distinct()
    )


def malformed_hours(summary: DataFrame, day_start_ms: int) -> DataFrame:
    """(window_ms, lines): malformed lines per file hour of the audited day."""
    return (
        summary.where(
            F.col("malformed")
            & (F.col("file_hour_ms") >= day_start_ms)
            & (F.col("file_hour_ms") < day_start_ms + 24 * HOUR_MS)
        )
        .groupBy(F.col("file_hour_ms").alias("window_ms"))
        .agg(F.sum("lines").alias("lines"))
    )


def input_gaps(hours: DataFrame, first_hour_ms: int, end_hour_ms: int) -> DataFrame:
    """Hours in [first, end) where a process's log has a hole: a file the hour before, none in
    the hour, and a file again later. A process that stops for good (shutdown, scale-in) leaves
    no hole; its unconsumed messages are reported as what they look like."""
    keys = ["source", "process", "consumer_group"]
    following = hours.select(*keys, (F.col("hour_ms") + HOUR_MS).alias("hour_ms"))
    present = hours.select(*keys, "hour_ms")
    last = hours.groupBy(*keys).agg(F.max("hour_ms").alias("last_hour_ms"))
    missing = following.join(
        present,
        on=[following[k].eqNullSafe(present[k]) for k in [*keys, "hour_ms"]],
        how="left_anti",
    )
    resumed = missing.join(
        last, on=[missing[k].eqNullSafe(last[k]) for k in keys], how="inner"
    ).where(missing["hour_ms"] < last["last_hour_ms"])
    return resumed.where(
        (missing["hour_ms"] >= first_hour_ms) & (missing["hour_ms"] < end_hour_ms)
    ).select(*[missing[k] for k in [*keys, "hour_ms"]])


def gap_windows(gaps: DataFrame, grace_ms: int) -> DataFrame:
    """(window_ms, consumer_group) whose pairs an input gap hides; a null group = every group."""
    producer = gaps.where(F.col("source") == "producer").select(
        F.col("hour_ms").alias("window_ms"), F.lit(None).cast("string").alias("consumer_group")
    )
    # A consumer gap at hour H hides deliveries of every window W with W <= H < W + 1h + grace.
    hours_back = (HOUR_MS + grace_ms - 1) // HOUR_MS
    earliest = F.col("hour_ms") - F.lit(hours_back * HOUR_MS)
    consumer = gaps.where(F.col("source") == "consumer").select(
        F.explode(F.sequence(earliest.cast("long"), "hour_ms", F.lit(HOUR_MS))).alias("window_ms"),
        "consumer_group",
    )
    return producer.unionByName(consumer).distinct()


def mark_gaps(pairs: DataFrame, gap_window: DataFrame) -> DataFrame:
    """Adds ``in_input_gap`` to classified pairs."""
    producer = gap_window.where(F.col("consumer_group").isNull()).select(
        "window_ms", F.lit(True).alias("producer_gap")
    )
    consumer = gap_window.where(F.col("consumer_group").isNotNull()).select(
        "window_ms", "consumer_group", F.lit(True).alias("consumer_gap")
    )
    return (
        pairs.join(F.broadcast(producer), on="window_ms", how="left")
        .join(F.broadcast(consumer), on=["window_ms", "consumer_group"], how="left")
        .withColumn(
            "in_input_gap",
            F.coalesce("producer_gap", F.lit(False)) | F.coalesce("consumer_gap", F.lit(False)),
        )
        .drop("producer_gap", "consumer_gap")
    )
