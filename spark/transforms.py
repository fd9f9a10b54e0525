"""Reconciliation facts: producer logs x consumer logs x store -> one row per (message, group).

Every function here is a pure ``DataFrame -> DataFrame`` transform; ``spark/metrics.py`` rolls the
facts up into windows, totals and evidence. Times are epoch milliseconds (UTC) until the output.

Definitions (the audit's contract, docs/design.md "Audit metrics")
------------------------------------------------------------------
message      a ``message_id`` seen in the producer logs. Its window is the UTC hour of its FIRST
             publish attempt (smallest ``ts``; ties by ``attempt``); its exchange and routing key
             are those of that attempt. Attempts logged before the audited day (the look-back
             read for this) keep a message out of the day; attempts logged in the grace period
             after the day still count as its retries.
publish state  exactly one per message, so the four sum to ``distinct_published``:
             ``confirmed`` if any attempt was acked, else ``returned`` if any was returned, else
             ``nacked`` if any was nacked, else ``unconfirmed`` (timeout/error only).
expected group  a group expected to receive a message: one whose expectation for the message's
             exchange and routing key (exchange equal, routing key matching the topic pattern)
             holds at its first publish ``ts``. Expectations come from three sources:
             ``bound``: the bindings history (a binding counts from the first to the last time the
             history saw it; one present when the history began counts from the start), or a
             snapshot taken at audit time when there is no history; ``configured``:
             ``AUDIT_BINDINGS``, which replaces the broker's bindings; ``observed``: a group that
             logged lines of messages of a key no binding or configuration names it for that day
             is expected for that exact key from the start of the window of the first such
             message to the end of the window of the last one. (A group bound to the key at any
             time of the day is held to its bindings only: its consumption outside them is
             counted, not turned into an expectation.) ``traced``: the broker's firehose said
             which queues it routed each publish of the key to (spark/trace_facts.py); where it
             did, those replace every other source for the key. Each lost pair shows its
             strongest source (traced, configured, bound, observed).
pair         (message, consumer group) for every expected group and every group that logged a
             delivery of it. A message with neither gets one pair with a null group.
unclaimed    confirmed messages with no expected group: no binding, configuration or observation
             says who should have received them. Counted (``unclaimed``) with their ids, never
             treated as fine.
unbound_consumption  pairs of a group that logged lines of messages of a key no binding or
             configuration names it for that day (such a group is then ``observed``).
missing_consumer_logs  (window, group) where the group was expected to receive confirmed
             messages of the window (acknowledged producer lines of the key in that file hour)
             and none of its consumers wrote any line from the window's start to the end of the
             hour of its deadline: its log is missing (or all of it was down). Its pairs of that
             window are in an input gap: ``unverified``, not ``lost``. Checked once the deadline
             has passed.
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
sent         a span's publish (spark/spans.py): published, confirmation unknown. Its own publish
             state (the five states sum to ``distinct_published``); never in a message with log
             lines (the log wins). ``expected_sent``: expected pairs of sent messages; a sent
             pair unaccounted in a FINAL window outside a gap is ``lost_confirmation_unknown``,
             never ``lost`` (``loss_ppm`` stays confirmed-only) nor ``unconfirmed``; in a gap
             ``unverified``, before the deadline ``pending``.
delivered    a span's delivery with an ok status: received (it counts as consumed) but never an
             ack: another delivery of it is a duplicate delivery.
received_unknown  expected pairs of a confirmed or sent message, not consumed and not
             dead-lettered, whose group has a ``failed`` span of it: received, outcome unknown
             (requeued, rejected or acked: the span cannot say). Not lost, not fine.
recoverable  expected pairs of a confirmed or sent message, not consumed, dead-lettered for their
             group: in Lazarus (the dead letter's ``store_id``), replayable. With ``lost`` and
             ``lost_confirmation_unknown`` (nowhere: truly lost) it splits what was not received.
malformed    a line that does not parse against the schema, lacks a required field or has an
             unknown schema version; counted in the window of the file's ``dt``/``hour``.
"""

# How the job computes it (not part of the contract above). Producer and consumer lines are
# shuffled by message_id (together; each log on its own when the exact path takes every message),
# and folded by ONE hash aggregate into a row per message
# (``per_message``: first attempt, state, which groups logged a line, and the lines' counts and
# times as if they were one pair's). For a message whose lines come from one group and lie all
# before or all after its deadline, that row IS its pairs (``message_pairs``): no join, no
# second aggregate. The rest (orphan lines, lines of several groups, lines on both sides of the
# deadline) take the exact path in a second job: their lines are picked out of the consumer
# logs again, joined to their message's facts (``pair_contributions``) and summed into pairs
# (``pairs``; these three live in ``spark/pairing.py``). Every aggregation buffer is
# fixed-width so the aggregates run as generated code: a routing key travels as a 64-bit hash,
# the set of bound groups that logged a line as a bitmask. A group travels as its 64-bit hash
# through the shuffle, the pairs and the rollup; its name comes back on the rolled rows. The
# logs' small facts (routing keys, hours, malformed lines, queues) come from
# ``spark/log_facts.py``.

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark.expectations import WORD_BITS
from spark.log_facts import group_hash, key_hash
from spark.schema import HOUR_MS

# ``delivered``: a span's received-and-handled delivery, settlement unknown (spark/spans.py).
CONSUMED_OUTCOMES = ("ack", "duplicate_skipped", "delivered")
# A span's delivery whose handler failed: received, outcome unknown (spark/spans.py).
RECEIVED_UNKNOWN_OUTCOMES = ("failed",)
DEAD_LETTER_REASONS = ("rejected", "expired", "maxlen", "delivery_limit")
# publish_state as a number: a message's state is the highest of its lines'.
# ``sent`` (a span's publish: confirmation unknown) is never in a message with log lines
# (``spans.merged``: the log wins), so its place in the order only ranks it above ``error``.
PUBLISH_STATES = ("unconfirmed", "nacked", "returned", "confirmed", "sent")
LINE_STATES = {"ack": 3, "returned": 2, "nack": 1, "sent": 4}
# Store rows of this kind are no store rows: a group's ``failed`` span of the message
# (``store_rows``' ``received``), which accounts for the pair as received, outcome unknown.
RECEIVED_KIND = "received_unknown"

# A message's attempts are ordered by (ts, attempt) packed into one long, so "the first attempt"
# is a fixed-width min_by: ts - day start in the high bits (a span of 2^29 ms = 6.2 days) and
# attempt + 2^31 + 1 in the low 33 bits (attempts are clamped to 32-bit; null attempt = 0).
# Lines outside the span sort last: they never hold the first attempt of a message of the day.
ATTEMPT_BITS = 33
ATTEMPT_ORDER_SPAN_MS = 1 << 29
LAST = (1 << 63) - 1

STORE_ROW_TYPE = T.StructType(
    [
        T.StructField("collected_ms", T.LongType()),
        T.StructField("id", T.LongType()),
        T.StructField("kind", T.StringType()),
        T.StructField("reason", T.StringType()),
        T.StructField("replay_count", T.LongType()),
        T.StructField("covered_group", T.LongType()),  # its group's hash
    ]
)


def valid_lines(logs: DataFrame) -> DataFrame:
    return logs.where(~F.col("malformed"))


def hour_of(ts: Column) -> Column:
    return ts - F.pmod(ts, F.lit(HOUR_MS))


def by_message(lines: DataFrame) -> DataFrame:
    """The shuffle: everything about one message_id in one partition.

    Exactly ``spark.sql.shuffle.partitions`` of them, which adaptive execution leaves alone:
    coalesced, a 2M-message day's main pass ran as 3 tasks on 2 cores, the last one alone.
    (More partitions than that cost more than they save: each one's partial rollup repeats
    the rollup's keys, and smaller hash maps did not make up for it at 10M.)"""
    partitions = int(lines.sparkSession.conf.get("spark.sql.shuffle.partitions"))
    return lines.repartition(partitions, "message_id")


def keyed_producer_lines(producer_lines: DataFrame, day_start_ms: int) -> DataFrame:
    """Valid producer lines as ``per_message`` reads them: key hash, attempt order, line state."""
    ts = F.col("ts")
    attempt = F.least(F.greatest("attempt", F.lit(-(2**31))), F.lit(2**31 - 1)) + (2**31 + 1)
    in_span = (ts >= day_start_ms) & (ts < day_start_ms + ATTEMPT_ORDER_SPAN_MS)
    order = F.when(
        in_span, (ts - day_start_ms) * (1 << ATTEMPT_BITS) + F.coalesce(attempt, F.lit(0))
    ).otherwise(F.lit(LAST))
    state = F.lit(0)
    for outcome, code in LINE_STATES.items():
        state = F.when(F.col("outcome") == outcome, code).otherwise(state)
    return producer_lines.select(
        "message_id",
        "ts",
        order.alias("attempt_order"),
        key_hash().alias("key_hash"),
        state.cast("byte").alias("state"),
    )


def _line_group_hash() -> Column:
    """A consumer line's group hash: the one its ``bit_groups`` row carries (hashed once per
    group, not once per line), hashed here only for a group that table lacks."""
    return F.coalesce(F.col("bit_group_hash"), group_hash()).alias("group_hash")


def grouped_consumer_lines(consumer_lines: DataFrame, bit_groups: DataFrame) -> DataFrame:
    """Valid consumer lines as the exact path's ``pair_contributions`` reads them: the group's
    hash and bit, and ``line``. The group travels as its hash only (``audit_frames`` puts the
    names back on the rollup). ``bit_groups``: (consumer_group, bit, bit_group_hash), as
    ``rollup.rolled`` makes it."""
    line = F.struct(
        "consumer",
        "ts",
        F.coalesce("redelivered", F.lit(False)).alias("redelivered"),
        F.col("outcome").isin(*CONSUMED_OUTCOMES).alias("consuming"),
    )
    return consumer_lines.join(F.broadcast(bit_groups), on="consumer_group", how="left").select(
        "message_id", _line_group_hash(), "bit", line.alias("line")
    )


def message_lines(consumer_lines: DataFrame, bit_groups: DataFrame) -> DataFrame:
    """Valid consumer lines as ``per_message`` folds them: the group's hash and bit, the line's
    ``line_ts``, whether it was ``redelivered`` and whether it was ``consuming``. (Its consumer
    travels only on the exact path, ``grouped_consumer_lines``.) ``bit_groups``:
    (consumer_group, bit, bit_group_hash), as ``rollup.rolled`` makes it."""
    return consumer_lines.join(F.broadcast(bit_groups), on="consumer_group", how="left").select(
        "message_id",
        _line_group_hash(),
        "bit",
        F.col("ts").alias("line_ts"),
        F.coalesce("redelivered", F.lit(False)).alias("redelivered"),
        F.col("outcome").isin(*CONSUMED_OUTCOMES).alias("consuming"),
    )


def per_message(
    producers: DataFrame, consumers: DataFrame, words: int, shuffled: bool = False
) -> DataFrame:
    """One row per message_id of either log: first attempt time and key, attempts, publish
    state, and which groups logged a line (lowest ``min_group_hash``, bound groups' bitmask
    ``seen_0``..).

    It also folds the consumer lines as if they were one pair's (``max_group_hash``, the group's
    ``bit``, ``redelivered``, first and last consuming ``ts``, first and last line ``ts``): exact
    for a message whose lines all come from one group, which ``message_pairs`` checks.
    ``consumers``: ``message_lines``, or ``grouped_consumer_lines`` when ``pair_contributions``
    joins the same frame: its ``line`` is then referenced whole, so that both read one shuffle
    (column pruning would make two different ones). Both ``shuffled`` (each ``by_message``, as
    the exact path needs the consumers' shuffle for itself): their union keeps the shuffles'
    partitioning, no new shuffle. Otherwise their union is shuffled once (``by_message``), so
    the aggregate reads its rows straight from the shuffle: shuffled apart, each line is
    projected into the union's columns again after it, a row copy per line."""
    none = {
        "ts": "long",
        "attempt_order": "long",
        "key_hash": "long",
        "state": "byte",
        "group_hash": "long",
        "bit": "int",
        "line_ts": "long",
        "redelivered": "boolean",
        "consuming": "boolean",
    }
    if "line" in consumers.columns:
        consumers = consumers.select(
            "*",
            F.col("line.ts").alias("line_ts"),
            F.col("line.redelivered").alias("redelivered"),
            F.col("line.consuming").alias("consuming"),
        )
        none["line"] = consumers.schema["line"].dataType.simpleString()
        # A whole-struct reference (count("line") would be simplified to count(1) and lost).
        line_count = "count(CASE WHEN group_hash IS NOT NULL THEN line END) AS line_count"
    else:
        line_count = "count(group_hash) AS line_count"

    def aligned(frame: DataFrame) -> DataFrame:
        return frame.selectExpr(
            "message_id",
            *[c if c in frame.columns else f"CAST(NULL AS {t}) AS {c}" for c, t in none.items()],
        )

    lines = aligned(producers).unionByName(aligned(consumers))
    facts = (
        (lines if shuffled else by_message(lines))
        .groupBy("message_id")
        .agg(
            F.min("ts").alias("first_ts"),
            F.min_by("key_hash", "attempt_order").alias("key_hash"),
            F.count("attempt_order").alias("attempts"),
            F.max("state").alias("state"),
            *sql_exprs(
                "min(group_hash) AS min_group_hash",
                "max(group_hash) AS max_group_hash",
                line_count,
                "min(bit) AS bit",
                "count_if(redelivered) AS redelivered",
                "min(CASE WHEN consuming THEN line_ts END) AS first_consumed_ts",
                "max(CASE WHEN consuming THEN line_ts END) AS last_consumed_ts",
                "min(line_ts) AS first_line_ts",
                "max(line_ts) AS last_line_ts",
                *[
                    f"coalesce(bit_or(CASE WHEN floor(bit / {WORD_BITS}) = {w} "
                    f"THEN shiftleft(1L, pmod(bit, {WORD_BITS})) END), 0L) AS seen_{w}"
                    for w in range(words)
                ],
            ),
        )
    )
    return facts.withColumn("window_ms", hour_of(F.col("first_ts")))


def sql_exprs(*sql: str) -> list[Column]:
    """Columns from SQL text: one round trip to the JVM each, not one per operator."""
    return [F.expr(e) for e in sql]


def with_expected(messages: DataFrame, expectations: DataFrame, words: int) -> DataFrame:
    """Adds the groups expected to receive the message when it was first published (its first
    attempt's key and ``first_ts``) as a bitmask (``expected_0``..), and the groups a binding
    or the configuration names for its key at any time of the day (``bound_0``..).

    ``expectations``: ``LogFacts.expectations`` rows, one per key and time span: a broadcast
    hash join on the key with the span as its condition."""
    masks = [f"{m}_{w}" for m in ("expected", "bound") for w in range(words)]
    spans = expectations.withColumnRenamed("key_hash", "span_key")
    on = (
        (F.col("key_hash") == F.col("span_key"))
        & (F.col("first_ts") >= F.col("from_ms"))
        & (F.col("first_ts") < F.col("until_ms"))
    )
    return (
        messages.join(F.broadcast(spans), on=on, how="left")
        .drop("span_key", "from_ms", "until_ms")
        .fillna(0, subset=masks)
    )


def received_unknown_rows(consumer_lines: DataFrame) -> DataFrame:
    """The (message_id, consumer_group) of valid consumer lines that say a delivery was
    received and its outcome is unknown (a ``failed`` span), as ``store_rows`` reads them."""
    return (
        consumer_lines.where(F.col("outcome").isin(*RECEIVED_UNKNOWN_OUTCOMES))
        .select("message_id", "consumer_group")
        .distinct()
    )


def store_rows(
    store: DataFrame, queue_groups: DataFrame, received: DataFrame | None = None
) -> DataFrame:
    """message_id -> its store rows (each once per group its source queue belongs to), and the
    first ``store_id``. ``queue_groups``: (queue, consumer_group). A dead letter's covered group
    is the group's hash, null when its queue is unknown (it covers every group).
    ``received`` (``received_unknown_rows``, or None): each becomes a row of kind
    ``RECEIVED_KIND`` covering its group, with no id: it accounts for the pair (not lost),
    never as a dead letter nor as consumed (``classify_pairs``)."""
    rows = store.where(F.col("message_id").isNotNull()).join(
        F.broadcast(queue_groups.withColumnRenamed("queue", "source_queue")),
        on="source_queue",
        how="left",
    )
    row = F.struct(
        (F.unix_micros("collected_at") / 1000).cast("long").alias("collected_ms"),
        F.col("id").alias("id"),
        F.col("kind").alias("kind"),
        F.col("reason").alias("reason"),
        F.coalesce("replay_count", F.lit(0).cast("long")).alias("replay_count"),
        F.when(
            (F.col("kind") == "dead_letter") & F.col("consumer_group").isNotNull(),
            group_hash(),
        ).alias("covered_group"),
    )
    rows = rows.select("message_id", row.alias("row"), "id")
    if received is not None:
        rows = rows.unionByName(
            received.select(
                "message_id",
                F.struct(
                    F.lit(None).cast("long").alias("collected_ms"),
                    F.lit(None).cast("long").alias("id"),
                    F.lit(RECEIVED_KIND).alias("kind"),
                    F.lit(None).cast("string").alias("reason"),
                    F.lit(0).cast("long").alias("replay_count"),
                    group_hash().alias("covered_group"),
                ).alias("row"),
                F.lit(None).cast("long").alias("id"),
            )
        )
    return rows.groupBy("message_id").agg(
        F.collect_list("row").alias("store_rows"), F.min("id").alias("store_id")
    )


def with_store(pairs: DataFrame, stored: DataFrame) -> DataFrame:
    """Adds ``store_rows`` and ``store_id``; drops the lines the store knows (not orphans)."""
    joined = pairs.join(stored.hint("shuffle_hash"), on="message_id", how="left")
    return joined.where(F.col("first_ts").isNotNull() | F.col("store_id").isNull())


def classify_pairs(pairs: DataFrame, carry: tuple[str, ...] = ()) -> DataFrame:
    """Per pair: consumed, dead-lettered, recovered, unaccounted, duplicates by cause; the
    ``carry`` columns pass through.

    Few pairs have store rows: the others skip the array functions."""
    group = F.col("group_hash")

    def covers(row: Column) -> Column:
        return row["covered_group"].isNull() | (row["covered_group"] == group)

    stored = F.coalesce(F.size("store_rows") > 0, F.lit(False))
    with_rows = pairs.withColumns(
        {
            "dead_letters": F.when(
                stored,
                F.filter("store_rows", lambda s: (s["kind"] == "dead_letter") & covers(s)),
            ).otherwise(F.array().cast(T.ArrayType(STORE_ROW_TYPE).simpleString())),
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
    confirmed = F.col("state") == PUBLISH_STATES.index("confirmed")
    # A span's publish: confirmation unknown, audited beside the confirmed ones, never as one.
    sent = F.col("state") == PUBLISH_STATES.index("sent")
    received = stored & F.exists("store_rows", lambda s: (s["kind"] == RECEIVED_KIND) & covers(s))
    not_received = F.col("expected") & (confirmed | sent) & ~consumed
    return with_rows.select(
        "message_id",
        "window_ms",
        "key_hash",
        "group_hash",
        "primary",
        "attempts",
        "state",
        "store_id",
        "expected",
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
        (not_received & ~F.col("covered")).alias("unaccounted"),
        # dead-lettered for its group and in the store, never consumed since: recoverable
        (not_received & dead_lettered).alias("recoverable"),
        F.when(not_received & dead_lettered, first_dead_letter["id"]).alias("dead_letter_id"),
        (not_received & ~dead_lettered & received).alias("received_unknown"),
        (F.col("primary") & ~F.col("expected") & confirmed).alias("unclaimed"),
        F.coalesce("unbound", F.lit(False)).alias("unbound"),
        by_broker.alias("dup_broker_redelivery"),
        by_retry.alias("dup_producer_retry"),
        (unflagged - by_retry).alias("dup_consumer_reprocessing"),
        F.col("first_ts").isNull().alias("orphan"),
        "orphan_consumer",
        "orphan_ts",
        "lines",
        *carry,
    )


def with_key_names(pairs: DataFrame, keys: DataFrame) -> DataFrame:
    """key_hash -> exchange, routing_key."""
    return pairs.join(
        F.broadcast(keys.select("key_hash", "exchange", "routing_key")), on="key_hash", how="left"
    ).drop("key_hash")


def mark_gaps(rows: DataFrame, gap_window: DataFrame) -> DataFrame:
    """Adds ``in_input_gap`` by (window_ms, group_hash); ``gap_window``: (window_ms,
    consumer_group), a null group = every group."""
    producer = gap_window.where(F.col("consumer_group").isNull()).select(
        "window_ms", F.lit(True).alias("producer_gap")
    )
    consumer = gap_window.where(F.col("consumer_group").isNotNull()).select(
        "window_ms", group_hash().alias("group_hash"), F.lit(True).alias("consumer_gap")
    )
    return (
        rows.join(F.broadcast(producer), on="window_ms", how="left")
        .join(F.broadcast(consumer), on=["window_ms", "group_hash"], how="left")
        .withColumn(
            "in_input_gap",
            F.coalesce("producer_gap", F.lit(False)) | F.coalesce("consumer_gap", F.lit(False)),
        )
        .drop("producer_gap", "consumer_gap")
    )
