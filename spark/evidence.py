"""The audit's evidence: the ids behind its counts (lost, unclaimed, duplicated, orphan lines,
input gaps), one row per message, pair or cause, read from the rollup (``spark/rollup.py``)."""

from collections import defaultdict

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark.expectations import SOURCES
from spark.log_facts import local_frame
from spark.metrics import DUP_CAUSES
from spark.schema import HOUR_MS

_DUPLICATED = "greatest(" + ", ".join(f"evidence.dup_{c}" for c in DUP_CAUSES) + ") > 0"
# The rolled rows each evidence output lists (a SQL condition on a row of ``rollup.rolled``).
# ``rollup`` counts them while it checkpoints the rollup, so an output with none is written
# empty without reading the rollup again (on a day with millions of unverified pairs, each
# such read was a second of task CPU).
LISTED = {
    "lost": "evidence.lost",
    # lost and unclaimed rows need not be exploded to be dropped
    "duplicates": f"NOT orphan AND evidence IS NOT NULL AND ({_DUPLICATED})",
    "orphans": "orphan",
    "unclaimed": "evidence.unclaimed",
    "recoverable": "evidence.recoverable",
    "received_unknown": "evidence.received_unknown",
}


def listed_counts(where: str = "TRUE") -> dict[str, str]:
    """``LISTED`` as aggregates: name -> count of the rows (of those ``where`` holds)."""
    return {name: f"count_if(({listed}) AND {where})" for name, listed in LISTED.items()}


def listing(rolled: DataFrame, listed: dict[str, int], name: str) -> DataFrame:
    """``rolled`` for the output ``name``, or, when ``listed`` (``listed_counts``' values)
    says it lists nothing, the same frame emptied: the optimizer then drops its read."""
    return rolled if listed[name] else rolled.where(F.lit(False))


def expected_by_segments(provenance, day_start_ms: int) -> list[tuple]:
    """``log_facts.PROVENANCE_COLUMNS`` rows -> (exchange, routing_key, consumer_group,
    from_window, until_window, expected_by): per key and group, the day's windows (every lost
    pair's window is its message's first hour, in the audited day) cut where the strongest
    source of an expectation overlapping the window changes; disjoint, so a lost pair matches
    one at most."""
    ranks = defaultdict(list)
    for exchange, routing_key, group, from_ms, until_ms, source in provenance:
        ranks[(exchange, routing_key, group)].append((from_ms, until_ms, SOURCES.index(source)))
    out = []
    for key, spans in sorted(ranks.items(), key=lambda item: tuple(map(str, item[0]))):
        for hour in range(24):
            window = day_start_ms + hour * HOUR_MS
            found = [r for lo, hi, r in spans if lo < window + HOUR_MS and window < hi]
            source = SOURCES[min(found)] if found else None
            if out and out[-1][:3] == key and out[-1][5] == source and out[-1][4] == window:
                out[-1] = (*key, out[-1][3], window + HOUR_MS, source)
            elif source is not None:
                out.append((*key, window, window + HOUR_MS, source))
    return out


def lost_evidence(rolled: DataFrame, provenance, day_start_ms: int) -> DataFrame:
    """The unaccounted pairs of FINAL windows: ``lost``, or ``unverified`` in an input gap, and
    ``expected_by``: the strongest source of the group's expectation over the window
    (``provenance``: ``log_facts.PROVENANCE_COLUMNS`` rows; configured, bound, observed), looked
    up in ``expected_by_segments`` on the driver: the lost rows, as many as the day's messages on
    a day a log is missing, take one broadcast join each and are never grouped."""
    lost = rolled.where(LISTED["lost"]).selectExpr(
        "window_ms",
        "timestamp_millis(window_ms) AS window_start",
        "exchange",
        "evidence.routing_key",
        "consumer_group",
        "evidence.message_id",
        "CAST(evidence.attempts AS int) AS attempts",
        "CASE WHEN in_input_gap THEN 'unverified' "
        "WHEN evidence.sent THEN 'lost_confirmation_unknown' ELSE 'lost' END AS verdict",
        "evidence.store_id",
    )
    segments = local_frame(
        rolled.sparkSession,
        expected_by_segments(provenance, day_start_ms),
        [
            ("p_exchange", "string"),
            ("p_routing_key", "string"),
            ("p_group", "string"),
            ("from_window", "bigint"),
            ("until_window", "bigint"),
            ("expected_by", "string"),
        ],
    )
    on = (
        (F.col("exchange") == F.col("p_exchange"))
        & (F.col("routing_key") == F.col("p_routing_key"))
        & (F.col("consumer_group") == F.col("p_group"))
        & (F.col("window_ms") >= F.col("from_window"))
        & (F.col("window_ms") < F.col("until_window"))
    )
    return lost.join(F.broadcast(segments), on=on, how="left").select(
        *[c for c in lost.columns if c != "window_ms"], "expected_by"
    )


def recoverable_evidence(rolled: DataFrame) -> DataFrame:
    """The expected pairs no consumer of the group received whose message is dead-lettered for
    the group and in Lazarus: ``store_id`` is that dead letter (the audit page links it and
    replays them as one job)."""
    return rolled.where(LISTED["recoverable"]).selectExpr(
        "timestamp_millis(window_ms) AS window_start",
        "exchange",
        "evidence.routing_key",
        "consumer_group",
        "evidence.message_id",
        "CAST(evidence.attempts AS int) AS attempts",
        "CASE WHEN evidence.sent THEN 'confirmation_unknown' ELSE 'confirmed' END AS published",
        "evidence.dead_letter_id AS store_id",
    )


def received_unknown_evidence(rolled: DataFrame) -> DataFrame:
    """The expected pairs whose only consumer evidence is a failed span: received, outcome
    unknown (requeued, rejected or acked: the span cannot say); neither lost nor handled."""
    return rolled.where(LISTED["received_unknown"]).selectExpr(
        "timestamp_millis(window_ms) AS window_start",
        "exchange",
        "evidence.routing_key",
        "consumer_group",
        "evidence.message_id",
        "evidence.store_id",
    )


def with_sources(evidence: DataFrame, sources) -> DataFrame:
    """Adds ``producer_source`` and ``consumer_source`` (``log``, ``span`` or ``log+span``):
    what the audit read for the row's exchange and routing key and for its group that day
    (``LogFacts.sources``: (side, name, sources) rows, small: a broadcast join each)."""
    spark = evidence.sparkSession
    producer = local_frame(
        spark,
        [(ex, rk, src) for side, ex, rk, src in sources if side == "producer"],
        [("s_exchange", "string"), ("s_routing_key", "string"), ("producer_source", "string")],
    )
    consumer = local_frame(
        spark,
        [(group, src) for side, group, _, src in sources if side == "consumer"],
        [("s_group", "string"), ("consumer_source", "string")],
    )
    out = evidence
    if "routing_key" in evidence.columns:
        on = (F.col("exchange") == F.col("s_exchange")) & (
            F.coalesce(F.col("routing_key"), F.lit("")) == F.col("s_routing_key")
        )
        out = out.join(F.broadcast(producer), on=on, how="left").drop("s_exchange", "s_routing_key")
    if "consumer_group" in evidence.columns:
        out = out.join(
            F.broadcast(consumer), on=F.col("consumer_group") == F.col("s_group"), how="left"
        ).drop("s_group")
    return out


def unclaimed_evidence(rolled: DataFrame) -> DataFrame:
    """The confirmed messages no group was expected to receive."""
    return rolled.where(LISTED["unclaimed"]).selectExpr(
        "timestamp_millis(window_ms) AS window_start",
        "exchange",
        "evidence.routing_key",
        "evidence.message_id",
        "CAST(evidence.attempts AS int) AS attempts",
        "evidence.store_id",
    )


def duplicate_evidence(rolled: DataFrame) -> DataFrame:
    """One row per duplicated pair and cause, with the extra deliveries that cause explains."""
    causes = ", ".join(
        f"named_struct('cause', '{cause}', 'extra', evidence.dup_{cause})" for cause in DUP_CAUSES
    )
    return (
        rolled.where(LISTED["duplicates"])
        .selectExpr("*", f"explode(array({causes})) AS c")
        .where("c.extra > 0")
        .selectExpr(
            "timestamp_millis(window_ms) AS window_start",
            "exchange",
            "consumer_group",
            "evidence.message_id",
            "c.cause AS cause",
            "CAST(c.extra AS bigint) AS extra_deliveries",
            "CAST(evidence.deliveries AS bigint) AS deliveries",
            "evidence.store_id",
        )
    )


def orphan_evidence(rolled: DataFrame) -> DataFrame:
    """One row per orphan line (identical lines once each)."""
    return (
        rolled.where(LISTED["orphans"])
        .selectExpr("*", "explode(array_repeat(0, CAST(lines AS int)))")
        .selectExpr(
            "timestamp_millis(window_ms) AS window_start",
            "consumer_group",
            "evidence.orphan_consumer AS consumer",
            "evidence.message_id",
            "timestamp_millis(evidence.orphan_ts) AS consumed_at",
        )
    )


def gap_evidence(gaps: DataFrame) -> DataFrame:
    return gaps.selectExpr(
        "timestamp_millis(hour_ms) AS window_start", "source", "process", "consumer_group"
    )
