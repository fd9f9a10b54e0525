"""Roll classified pairs up into the audit's outputs: windows, totals and the evidence tables.

Definitions of every metric are in the docstring of ``spark/transforms.py``. The final ``select``
of each output function is the output's schema contract.

The pairs are rolled up ONCE (``rollup``): additive counts per window x exchange x group x
primary x latency bucket, plus one row per pair or orphan line the evidence lists. Every output
reads that frame, so the job persists it instead of the pairs; it is small (evidence is the
exception). Latencies are rolled up ``LATENCY_SLOTS`` milliseconds at a time: a row's
``latency_ms`` is the first millisecond of its bucket and ``SLOT_COLUMNS`` count its pairs at
each millisecond of the bucket, so the rollup stays exact to the millisecond with
``LATENCY_SLOTS`` times fewer keys than one per millisecond (a day's partial rollup was ~240k
keys per task, the main pass's costliest part). Latency percentiles are exact nearest-rank values
(the latency at rank ceil(p x n) of the n non-negative ones) read off the latency histogram,
which holds at most one entry per key and bucket of (1 h + grace), the longest on-time
latency: it is collected once (Arrow), spread back to one entry per millisecond
(``histogram_rows``) and walked on the driver in integer arithmetic, for the windows and the
totals alike; the ratios stay in Spark SQL.

Expressions are SQL text: each costs one round trip to the JVM, where a column built from
Python calls costs one per operator, and an audit builds a few thousand of them.
"""

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from spark.schema import HOUR_MS
from spark.transforms import DEAD_LETTER_REASONS, PUBLISH_STATES, sql_exprs

COUNT_METRICS = (
    "publish_attempts",
    "distinct_published",
    "producer_retries",
    "confirmed",
    "nacked",
    "returned",
    "unconfirmed",
    "expected_confirmed",
    "delivered_unique",
    "dead_lettered",
    "dead_lettered_rejected",
    "dead_lettered_expired",
    "dead_lettered_maxlen",
    "dead_lettered_delivery_limit",
    "recovered",
    "lost",
    "unverified",
    "pending",
    "dup_msgs",
    "dup_deliveries",
    "dup_producer_retry",
    "dup_broker_redelivery",
    "dup_consumer_reprocessing",
    "late_deliveries",
    "orphan_consumptions",
    "clock_skew",
    "malformed_lines",
    "input_gaps",
    "unclaimed",
    "unbound_consumption",
    "missing_consumer_logs",
    # What spans cannot prove (spark/spans.py; the definitions: spark/transforms.py):
    "sent",
    "expected_sent",
    "lost_confirmation_unknown",
    "received_unknown",
    # Expected pairs not received but dead-lettered for their group and in the store.
    "recoverable",
)
# What the audit could not decide: a run or window with any of these is never a plain success.
WARNING_METRICS = (
    "unclaimed",
    "unbound_consumption",
    "missing_consumer_logs",
    "unverified",
    "input_gaps",
    "malformed_lines",
    "orphan_consumptions",
    "lost_confirmation_unknown",
    "received_unknown",
)
LATENCY_METRICS = ("latency_p50_ms", "latency_p95_ms", "latency_p99_ms", "latency_max_ms")
RATIO_METRICS = ("loss_ppm", "within_sla_share")
METRICS = (*COUNT_METRICS, "loss_ppm", *LATENCY_METRICS, "within_sla_share")
# Known only once a window is FINAL: null in PROVISIONAL windows.
FINAL_ONLY = ("lost", "unverified", "loss_ppm", "lost_confirmation_unknown")

WINDOW_KEYS = ("window_start", "window_end", "status", "exchange", "consumer_group")


def _metric_types() -> dict[str, T.DataType]:
    types = {m: T.LongType() for m in (*COUNT_METRICS, *LATENCY_METRICS)}
    types.update({m: T.DoubleType() for m in RATIO_METRICS})
    return types


METRIC_TYPES = _metric_types()


# Percent, metric: nearest-rank percentiles of the non-negative latencies, per window key.
QUANTILES = ((50, "latency_p50_ms"), (95, "latency_p95_ms"), (99, "latency_p99_ms"))
QUANTILE_KEYS = ("window_ms", "exchange", "consumer_group")
QUANTILE_COLUMNS = [
    ("window_ms", "bigint"),
    ("exchange", "string"),
    ("consumer_group", "string"),
    *[(name, "bigint") for _, name in QUANTILES],
]
DUP_CAUSES = ("producer_retry", "broker_redelivery", "consumer_reprocessing")
DUP_TOTAL = "(" + " + ".join(f"dup_{cause}" for cause in DUP_CAUSES) + ")"
CONFIRMED = PUBLISH_STATES.index("confirmed")
SENT = PUBLISH_STATES.index("sent")


# Milliseconds per latency bucket of the rollup, and the columns counting its pairs at each.
LATENCY_SLOTS = 8
SLOT_COLUMNS = tuple(f"latency_slot_{i}" for i in range(LATENCY_SLOTS))


def _final(grace_ms: int, now_ms: int) -> str:
    return f"(window_ms + {HOUR_MS + grace_ms} <= {now_ms})"


def rollup(
    facts: DataFrame,
    grace_ms: int,
    now_ms: int,
    carry: tuple[str, ...] = (),
    unbound_evidence: bool = True,
) -> DataFrame:
    """Classified pairs and orphan lines (``transforms.with_key_names``) -> additive counts per
    (window_ms, exchange, group_hash, primary, orphan, latency_ms, evidence). ``evidence`` is
    null except on the pairs and lines the evidence tables list, which keep a row each.
    ``unbound_evidence=False`` lists nothing on unbound pairs: for a first pass whose result
    is thrown away whenever it has any (``spark/audit.py``), so that pass does not carry a row
    per pair of a group that no binding names (every message, on a day without bindings).
    ``latency_ms`` is the pair's latency rounded down to a multiple of ``LATENCY_SLOTS``
    (null when it has none); ``SLOT_COLUMNS`` count the pairs at each millisecond of it.
    Input gaps depend on (window, group) only: ``transforms.mark_gaps`` marks the rolled rows.
    The ``carry`` columns are grouping keys too."""
    listed_lost = f"(NOT orphan AND unaccounted AND {_final(grace_ms, now_ms)})"
    fields = [
        "message_id",
        "routing_key",
        "attempts",
        "store_id",
        "deliveries",
        *[f"dup_{cause}" for cause in DUP_CAUSES],
        "orphan_consumer",
        "orphan_ts",
    ]
    listed_unclaimed = "(NOT orphan AND unclaimed)"
    listed_recoverable = "(NOT orphan AND recoverable)"
    listed_received = "(NOT orphan AND received_unknown)"
    listed = "" if unbound_evidence else "NOT unbound AND "
    evidence = (
        f"CASE WHEN {listed}({listed_lost} OR (NOT orphan AND {DUP_TOTAL} > 0) OR orphan "
        f"OR {listed_unclaimed} OR {listed_recoverable} OR {listed_received}) THEN named_struct("
        + ", ".join(f"'{f}', {f}" for f in fields)
        + f", 'lost', {listed_lost}, 'unclaimed', {listed_unclaimed}"
        f", 'sent', state = {SENT}, 'recoverable', {listed_recoverable}"
        f", 'received_unknown', {listed_received}, 'dead_letter_id', dead_letter_id) END"
        " AS evidence"
    )
    keys = [
        "window_ms",
        "exchange",
        "group_hash",
        "primary",
        "orphan",
        F.expr("latency_ms - latency_slot AS latency_ms"),
        *carry,
    ]
    # The key a group consumed without any binding naming it: what observation learns from.
    unbound_key = F.expr("CASE WHEN unbound THEN routing_key END AS unbound_routing_key")
    slotted = facts.withColumn(
        "latency_slot", F.expr(f"CAST(pmod(latency_ms, {LATENCY_SLOTS}) AS int)")
    )
    return slotted.groupBy(*keys, F.expr(evidence), unbound_key).agg(
        *sql_exprs(
            "count(1) AS pairs",
            "sum(attempts) AS attempts",
            *[f"count_if(state = {i}) AS {name}" for i, name in enumerate(PUBLISH_STATES)],
            f"count_if(expected AND state = {CONFIRMED}) AS expected_confirmed",
            "count_if(consumed) AS delivered_unique",
            "count_if(dead_lettered) AS dead_lettered",
            *[
                f"count_if(dead_letter_reason = '{r}') AS dead_lettered_{r}"
                for r in DEAD_LETTER_REASONS
            ],
            "count_if(recovered) AS recovered",
            "count_if(unaccounted) AS unaccounted",
            f"count_if(unaccounted AND state = {SENT}) AS unaccounted_sent",
            f"count_if(expected AND state = {SENT}) AS expected_sent",
            "count_if(recoverable) AS recoverable",
            "count_if(received_unknown) AS received_unknown",
            "count_if(unclaimed) AS unclaimed",
            "count_if(unbound) AS unbound_consumption",
            f"count_if({DUP_TOTAL} > 0) AS dup_msgs",
            *[f"sum(dup_{cause}) AS dup_{cause}" for cause in DUP_CAUSES],
            "sum(late_deliveries) AS late_deliveries",
            "sum(lines) AS lines",
            *[f"count_if(latency_slot = {i}) AS {c}" for i, c in enumerate(SLOT_COLUMNS)],
        )
    )


def _sum(column: str, scope: str | None = None) -> str:
    return f"sum({column})" if scope is None else f"sum(CASE WHEN {scope} THEN {column} ELSE 0 END)"


def _producer_counts(scope: str | None) -> list[str]:
    return [
        f"{_sum('attempts', scope)} AS publish_attempts",
        f"{_sum('pairs', scope)} AS distinct_published",
        f"{_sum('attempts', scope)} - {_sum('pairs', scope)} AS producer_retries",
        *[f"{_sum(state, scope)} AS {state}" for state in PUBLISH_STATES],
    ]


def _pair_counts(final: str, sla_ms: int) -> list[str]:
    """Aggregates over rollup rows of pairs; ``final`` says whether a row's window is FINAL.

    Percentiles come from ``nearest_rank_quantiles``."""
    on_clock = _sum("pairs", "latency_ms >= 0")
    # The pairs of a row's bucket at most sla_ms late, and its latest millisecond with a pair.
    within_sla = " + ".join(
        f"CASE WHEN latency_ms >= 0 AND latency_ms + {i} <= {sla_ms} THEN {c} ELSE 0 END"
        for i, c in enumerate(SLOT_COLUMNS)
    )
    latest = ", ".join(f"CASE WHEN {c} > 0 THEN {i} END" for i, c in enumerate(SLOT_COLUMNS))
    return [
        *[
            f"sum({name}) AS {name}"
            for name in (
                "expected_confirmed",
                "delivered_unique",
                "dead_lettered",
                *[f"dead_lettered_{r}" for r in DEAD_LETTER_REASONS],
                "recovered",
                "dup_msgs",
                *[f"dup_{cause}" for cause in DUP_CAUSES],
                "late_deliveries",
                "unclaimed",
                "unbound_consumption",
            )
        ],
        f"{_sum('unaccounted - unaccounted_sent', f'{final} AND NOT in_input_gap')} AS lost",
        f"{_sum('unaccounted_sent', f'{final} AND NOT in_input_gap')} AS lost_confirmation_unknown",
        "sum(expected_sent) AS expected_sent",
        "sum(recoverable) AS recoverable",
        "sum(received_unknown) AS received_unknown",
        f"{_sum('unaccounted', f'{final} AND in_input_gap')} AS unverified",
        f"{_sum('unaccounted', f'NOT {final}')} AS pending",
        f"sum({DUP_TOTAL}) AS dup_deliveries",
        f"{_sum('pairs', 'latency_ms < 0')} AS clock_skew",
        f"try_divide(sum({within_sla}), {on_clock}) AS within_sla_share",
        f"max(CASE WHEN latency_ms >= 0 THEN latency_ms + greatest({latest}) END)"
        " AS latency_max_ms",
    ]


def latency_histogram(rolled: DataFrame) -> DataFrame:
    """Pairs per ``QUANTILE_KEYS`` x non-negative latency bucket (``latency_ms``, its first
    millisecond) at each of its milliseconds (``SLOT_COLUMNS``): what the percentiles are read
    off (``histogram_rows``). At most one row per key and bucket of (1 h + grace)."""
    return (
        rolled.where("NOT orphan AND latency_ms >= 0")
        .groupBy(*QUANTILE_KEYS, "latency_ms")
        .agg(*sql_exprs(*[f"sum({c}) AS {c}" for c in SLOT_COLUMNS]))
    )


def histogram_rows(buckets: pa.Table) -> pa.Table:
    """``latency_histogram`` rows (collected) -> one row per key and millisecond with pairs:
    (*``QUANTILE_KEYS``, latency_ms, n), what ``nearest_rank_quantiles`` reads."""
    rows = buckets.num_rows
    counts = np.stack([buckets.column(c).to_numpy() for c in SLOT_COLUMNS], axis=1).reshape(-1)
    row = np.repeat(np.arange(rows), LATENCY_SLOTS)
    start = np.repeat(buckets.column("latency_ms").to_numpy(), LATENCY_SLOTS)
    latency = start + np.tile(np.arange(LATENCY_SLOTS), rows)
    some = counts > 0
    spread = buckets.select(list(QUANTILE_KEYS)).take(pa.array(row[some]))
    return spread.append_column("latency_ms", pa.array(latency[some], pa.int64())).append_column(
        "n", pa.array(counts[some], pa.int64())
    )


def _nearest_ranks(latency: np.ndarray, n: np.ndarray, starts: np.ndarray) -> list[np.ndarray]:
    """Per segment of rows (sorted by latency within it, segments starting at ``starts``): the
    latency at rank ceil(p / 100 x count) for each percent p of ``QUANTILES``, in integers."""
    cumulative = np.cumsum(n, dtype=np.int64)
    ends = np.append(starts[1:], len(n))
    before = np.where(starts > 0, cumulative[starts - 1], 0)
    count = cumulative[ends - 1] - before
    return [
        latency[np.searchsorted(cumulative, before + (percent * count + 99) // 100, side="left")]
        for percent, _ in QUANTILES
    ]


def nearest_rank_quantiles(histogram: pa.Table) -> tuple[list[tuple], tuple]:
    """``histogram_rows`` -> the exact nearest-rank percentiles: rows
    (*``QUANTILE_KEYS``, p50, p95, p99) per key, and (p50, p95, p99) over every key."""
    if histogram.num_rows == 0:
        return [], (None,) * len(QUANTILES)
    order = pc.sort_indices(
        histogram,
        sort_keys=[(k, "ascending") for k in (*QUANTILE_KEYS, "latency_ms")],
    )
    table = histogram.take(order)
    latency = table.column("latency_ms").to_numpy()
    n = table.column("n").to_numpy()
    keys = [np.array(table.column(k).to_pylist(), dtype=object) for k in QUANTILE_KEYS]
    changed = np.zeros(len(n), dtype=bool)
    changed[0] = True
    for key in keys:
        changed[1:] |= key[1:] != key[:-1]
    starts = np.flatnonzero(changed)
    per_key = _nearest_ranks(latency, n, starts)
    rows = [
        (*(key[i] for key in keys), *(int(values[s]) for values in per_key))
        for s, i in enumerate(starts)
    ]
    overall = np.argsort(latency, kind="stable")
    every = _nearest_ranks(latency[overall], n[overall], np.zeros(1, dtype=np.int64))
    return rows, tuple(int(values[0]) for values in every)


def _typed(metric: str, expression: str | None = None) -> str:
    return f"CAST({expression or metric} AS {METRIC_TYPES[metric].simpleString()}) AS {metric}"


def window_metrics(
    rolled: DataFrame,
    quantiles: DataFrame,
    hours: DataFrame,
    grace_ms: int,
    sla_ms: int,
    now_ms: int,
) -> DataFrame:
    """One row per window x exchange x consumer group, plus one per window with both keys null.

    ``quantiles``: ``QUANTILE_COLUMNS`` (``nearest_rank_quantiles`` per key); ``hours``: one row
    per window of the day (window_ms, malformed_lines, input_gaps, missing_consumer_logs), the
    keyless rows, which carry those three; ``orphan_consumptions`` sit on rows with a null
    exchange and the group.
    """
    final = _final(grace_ms, now_ms)
    keys = list(QUANTILE_KEYS)
    counts = (
        rolled.where("NOT orphan")
        .groupBy(*keys)
        .agg(*sql_exprs(*_producer_counts(None), *_pair_counts(final, sla_ms)))
    )
    published = counts.join(
        F.broadcast(quantiles), on=[counts[k].eqNullSafe(quantiles[k]) for k in keys], how="left"
    ).select(counts["*"], *[quantiles[name] for _, name in QUANTILES])
    orphan_rows = (
        rolled.where("orphan")
        .groupBy("window_ms", "consumer_group")
        .agg(F.expr("sum(lines) AS orphan_consumptions"))
    )
    rows = (
        published.unionByName(orphan_rows, allowMissingColumns=True)
        .unionByName(hours, allowMissingColumns=True)
        .fillna(0, subset=list(COUNT_METRICS))
    )
    final_only = {
        name: f"CASE WHEN {final} THEN {expression} END"
        for name, expression in (
            ("lost", "lost"),
            ("unverified", "unverified"),
            ("loss_ppm", "try_divide(lost * 1000000.0, expected_confirmed)"),
            ("lost_confirmation_unknown", "lost_confirmation_unknown"),
        )
    }
    return rows.selectExpr(
        "timestamp_millis(window_ms) AS window_start",
        f"timestamp_millis(window_ms + {HOUR_MS}) AS window_end",
        f"CASE WHEN {final} THEN 'FINAL' ELSE 'PROVISIONAL' END AS status",
        "exchange",
        "consumer_group",
        *[_typed(m, final_only.get(m)) for m in METRICS],
    )


def totals(
    rolled: DataFrame,
    quantiles: tuple,
    malformed_lines: int,
    input_gaps: int,
    missing_consumer_logs: int,
    grace_ms: int,
    sla_ms: int,
    now_ms: int,
) -> DataFrame:
    """One row: every metric over the whole run, each message counted once.

    ``quantiles``: (p50, p95, p99) over every pair (``nearest_rank_quantiles``); the malformed
    lines and input gaps are the driver's counts. ``lost`` and ``loss_ppm`` cover the FINAL
    windows; ``status`` is FINAL when all windows are.
    """
    final = _final(grace_ms, now_ms)
    # One aggregate over every rolled row: the orphan lines' rows add their lines only, the
    # others (their measures nulled on orphan rows) everything else.
    keys = ("window_ms", "exchange", "consumer_group", "primary", "orphan", "in_input_gap")
    measures = [c for c in rolled.columns if c not in keys and c != "evidence"]
    pairs_only = rolled.select(
        *keys,
        *[F.when(~F.col("orphan"), F.col(c)).alias(c) for c in measures],
        F.when(F.col("orphan"), F.col("lines")).alias("orphan_lines"),
    )
    joined = (
        pairs_only.agg(
            *sql_exprs(
                *_producer_counts("primary"),
                *_pair_counts(final, sla_ms),
                f"{_sum('pairs', f'NOT {final}')} AS provisional_pairs",
                f"{_sum('expected_confirmed', final)} AS final_expected_confirmed",
                "sum(orphan_lines) AS orphan_consumptions",
            )
        )
        .selectExpr(
            "*",
            *[
                f"CAST({'NULL' if value is None else value} AS bigint) AS {name}"
                for value, (_, name) in zip(quantiles, QUANTILES, strict=True)
            ],
            f"{malformed_lines}L AS malformed_lines",
            f"{input_gaps}L AS input_gaps",
            f"{missing_consumer_logs}L AS missing_consumer_logs",
        )
        .fillna(0, subset=list(COUNT_METRICS))
    )
    loss_ppm = "try_divide(lost * 1000000.0, final_expected_confirmed)"
    return joined.selectExpr(
        "CASE WHEN provisional_pairs > 0 THEN 'PROVISIONAL' ELSE 'FINAL' END AS status",
        *[_typed(m, loss_ppm if m == "loss_ppm" else None) for m in METRICS],
    )


def warnings(row: dict) -> list[dict]:
    """The ``WARNING_METRICS`` a totals or window row counts, as ``[{code, count}]``."""
    return [{"code": m, "count": row[m]} for m in WARNING_METRICS if row.get(m)]
