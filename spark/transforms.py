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

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark.schema import HOUR_MS

CONSUMED_OUTCOMES = ("ack", "duplicate_skipped")
PRODUCER_SIDE_KINDS = ("returned", "unroutable", "nacked", "unconfirmed")
DEAD_LETTER_REASONS = ("rejected", "expired", "maxlen", "delivery_limit")

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


def valid_lines(logs: DataFrame) -> DataFrame:
    return logs.where(~F.col("malformed"))


def message_facts(producer_lines: DataFrame) -> DataFrame:
    """One row per published message_id over every producer line read (look-back included)."""
    first = F.struct("ts", "attempt")
    outcomes = F.collect_set("outcome")
    facts = producer_lines.groupBy("message_id").agg(
        F.min("ts").alias("first_ts"),
        F.min_by("exchange", first).alias("exchange"),
        F.min_by(F.coalesce("routing_key", F.lit("")), first).alias("routing_key"),
        F.count(F.lit(1)).alias("attempts"),
        outcomes.alias("outcomes"),
    )
    state = (
        F.when(F.array_contains("outcomes", "ack"), "confirmed")
        .when(F.array_contains("outcomes", "returned"), "returned")
        .when(F.array_contains("outcomes", "nack"), "nacked")
        .otherwise("unconfirmed")
    )
    return facts.select(
        "message_id",
        "first_ts",
        (F.floor(F.col("first_ts") / HOUR_MS) * HOUR_MS).cast("long").alias("window_ms"),
        "exchange",
        "routing_key",
        F.col("attempts").cast("long").alias("attempts"),
        state.alias("publish_state"),
    )


def expected_groups(messages: DataFrame, bindings: DataFrame) -> DataFrame:
    """(exchange, routing_key) -> sorted array of the consumer groups bound to receive it.

    Matches the distinct keys only, so the regex join stays as small as the key space.
    """
    keys = messages.select("exchange", "routing_key").distinct()
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


def queue_groups(consumer_lines: DataFrame, bindings: DataFrame) -> DataFrame:
    """The set of (queue, consumer_group) pairs known from the consumer logs and the bindings."""
    logged = consumer_lines.where(F.col("queue").isNotNull()).select("queue", "consumer_group")
    configured = bindings.where(F.col("queue").isNotNull()).select("queue", "consumer_group")
    return logged.unionByName(configured).distinct()


def store_coverage(store: DataFrame, queue_group: DataFrame) -> DataFrame:
    """message_id -> the store rows that speak for it (``store_rows``), the first ``store_id``."""
    rows = store.where(F.col("message_id").isNotNull()).join(
        queue_group.withColumnRenamed("queue", "source_queue"), on="source_queue", how="left"
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
    return rows.groupBy("message_id").agg(
        F.collect_list(row).alias("store_rows"), F.min("id").alias("store_id")
    )


def audited_messages(
    messages: DataFrame, expected: DataFrame, coverage: DataFrame, day_start_ms: int
) -> DataFrame:
    """The messages first published in the audited day, with their groups and store rows."""
    day = messages.where(
        (F.col("window_ms") >= day_start_ms) & (F.col("window_ms") < day_start_ms + 24 * HOUR_MS)
    )
    no_store_rows = F.array().cast(T.ArrayType(STORE_ROW_TYPE))
    return (
        day.join(F.broadcast(expected), on=["exchange", "routing_key"], how="left")
        .join(coverage, on="message_id", how="left")
        .select(
            "message_id",
            "window_ms",
            "first_ts",
            "exchange",
            "routing_key",
            "attempts",
            "publish_state",
            F.coalesce("expected_groups", F.array().cast("array<string>")).alias("expected_groups"),
            F.coalesce("store_rows", no_store_rows).alias("store_rows"),
            "store_id",
        )
    )


def _pair_stats(grace_ms: int) -> list[Column]:
    """Per (message, group) delivery counts, each consumer line judged against its deadline."""
    on_time = F.col("c_ts") < F.col("window_ms") + HOUR_MS + grace_ms
    consuming_ts = F.when(on_time & F.col("c_outcome").isin(*CONSUMED_OUTCOMES), F.col("c_ts"))
    return [
        F.count_if(on_time).alias("deliveries"),
        F.count_if(on_time & F.coalesce("c_redelivered", F.lit(False))).alias("redelivered"),
        F.count_if(F.col("c_ts").isNotNull() & ~on_time).alias("late_deliveries"),
        F.min(consuming_ts).alias("first_consumed_ts"),
        F.max(consuming_ts).alias("last_consumed_ts"),
    ]


MESSAGE_COLUMNS = (
    "window_ms",
    "first_ts",
    "exchange",
    "routing_key",
    "attempts",
    "publish_state",
    "expected_groups",
    "store_rows",
    "store_id",
)


def message_group_pairs(messages: DataFrame, consumer_lines: DataFrame, grace_ms: int) -> DataFrame:
    """One row per (message, group): expected groups ∪ groups that logged a delivery.

    Joined and aggregated on message_id alone, so Spark keeps one partitioning from the join to
    the last aggregate instead of shuffling each step.
    """
    consumed = consumer_lines.select(
        "message_id",
        "consumer_group",
        F.col("ts").alias("c_ts"),
        F.col("redelivered").alias("c_redelivered"),
        F.col("outcome").alias("c_outcome"),
    )
    joined = messages.join(consumed, on="message_id", how="left")
    per_group = joined.groupBy("message_id", "consumer_group").agg(
        F.first(F.struct(*MESSAGE_COLUMNS)).alias("m"), *_pair_stats(grace_ms)
    )
    stats = [
        "deliveries",
        "redelivered",
        "late_deliveries",
        "first_consumed_ts",
        "last_consumed_ts",
    ]
    pair = F.struct(F.col("consumer_group"), *[F.col(s) for s in stats])
    per_message = per_group.groupBy("message_id").agg(
        F.first("m").alias("m"),
        F.filter(F.collect_list(pair), lambda p: p["consumer_group"].isNotNull()).alias("seen"),
    )
    missing = F.array_except(
        F.col("m.expected_groups"), F.transform("seen", lambda p: p["consumer_group"])
    )
    silent = F.transform(
        missing,
        lambda g: F.struct(
            g.alias("consumer_group"),
            F.lit(0).cast("long").alias("deliveries"),
            F.lit(0).cast("long").alias("redelivered"),
            F.lit(0).cast("long").alias("late_deliveries"),
            F.lit(None).cast("long").alias("first_consumed_ts"),
            F.lit(None).cast("long").alias("last_consumed_ts"),
        ),
    )
    nobody = F.array(
        F.struct(
            F.lit(None).cast("string").alias("consumer_group"),
            *[F.lit(0).cast("long").alias(s) for s in stats[:3]],
            *[F.lit(None).cast("long").alias(s) for s in stats[3:]],
        )
    )
    every = F.concat("seen", silent)
    all_pairs = F.when(F.size(every) > 0, every).otherwise(nobody)
    return per_message.select(
        "message_id",
        "m.*",
        F.posexplode(all_pairs).alias("pair_index", "p"),
    ).select(
        "message_id",
        *MESSAGE_COLUMNS,
        (F.col("pair_index") == 0).alias("primary"),
        "p.*",
    )


def classify_pairs(pairs: DataFrame) -> DataFrame:
    """Per pair: expected, consumed, dead-lettered, recovered, unaccounted, duplicates by cause."""
    group = F.col("consumer_group")

    def covers(row: Column) -> Column:
        return row["covered_group"].isNull() | (row["covered_group"] == group)

    dead_letters = F.filter("store_rows", lambda s: (s["kind"] == "dead_letter") & covers(s))
    first_dead_letter = F.array_min(dead_letters)
    replays = F.aggregate(
        dead_letters, F.lit(0).cast("long"), lambda acc, s: acc + s["replay_count"]
    )
    consumed = F.col("first_consumed_ts").isNotNull()
    extra = F.greatest(F.col("deliveries") - 1, F.lit(0))
    by_broker = F.least(F.col("redelivered"), extra)
    by_replay = F.least(extra - by_broker, replays)
    unflagged = extra - by_broker - by_replay
    by_retry = F.least(unflagged, F.col("attempts") - 1)
    expected = group.isNotNull() & F.array_contains("expected_groups", group)
    dead_lettered = F.size(dead_letters) > 0
    return pairs.select(
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
        (
            expected
            & (F.col("publish_state") == "confirmed")
            & ~consumed
            & ~F.exists("store_rows", covers)
        ).alias("unaccounted"),
        by_broker.alias("dup_broker_redelivery"),
        by_retry.alias("dup_producer_retry"),
        (unflagged - by_retry).alias("dup_consumer_reprocessing"),
    )


def process_hours(logs: DataFrame, process: str, source: str) -> DataFrame:
    """(source, process, consumer_group, hour_ms) for every hour a process wrote a log file."""
    group = F.col("consumer_group") if "consumer_group" in logs.columns else F.lit(None)
    return (
        logs.where(F.col(process).isNotNull())
        .select(
            F.lit(source).alias("source"),
            F.col(process).alias("process"),
            group.cast("string").alias("consumer_group"),
            F.col("file_hour_ms").alias("hour_ms"),
        )
        .distinct()
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


def orphan_lines(
    consumer_lines: DataFrame,
    messages: DataFrame,
    store: DataFrame,
    day_start_ms: int,
) -> DataFrame:
    """Consumer lines of the audited day for message ids no producer log or store row knows."""
    in_day = consumer_lines.where(
        (F.col("ts") >= day_start_ms) & (F.col("ts") < day_start_ms + 24 * HOUR_MS)
    )
    stored = store.where(F.col("message_id").isNotNull()).select("message_id")
    return (
        in_day.join(messages.select("message_id"), on="message_id", how="left_anti")
        .join(stored, on="message_id", how="left_anti")
        .select(
            (F.floor(F.col("ts") / HOUR_MS) * HOUR_MS).cast("long").alias("window_ms"),
            "consumer_group",
            "message_id",
            "consumer",
            "ts",
        )
    )
