"""The nightly audit's one entry point: ``spark-submit spark/audit.py --date YYYY-MM-DD ...``.

Also importable: ``run_audit(spark, ...)`` returns the output DataFrames; ``write_outputs`` stores
them as ``OUT/<name>/`` Parquet plus ``OUT/totals.json`` and ``OUT/manifest.json``.
No Django here: the console exports the store slice, calls this, and loads the results.
"""

import argparse
import json
import math
import os
import sys
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, date, datetime, timedelta

if __package__ in (None, ""):  # run as a script by spark-submit: make `spark.*` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from pyspark import StorageLevel
from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.util import inheritable_thread_target

from spark import evidence, expectations, log_facts, metrics, rollup, trace_facts
from spark import spans as spans_module
from spark.schema import (
    CONSUMER_LOG_SCHEMA,
    CONSUMER_REQUIRED,
    HOUR_MS,
    PRODUCER_LOG_SCHEMA,
    PRODUCER_REQUIRED,
    STORE_EXPORT_SCHEMA,
    epoch_ms,
    hour_partitions,
    list_log_files,
    load_bindings,
    read_logs,
)

OUTPUTS = (
    "windows",
    "totals",
    "lost",
    "duplicates",
    "orphans",
    "unclaimed",
    "recoverable",
    "received_unknown",
    "input_gaps",
    "expectations",
    "manifest",
)


def read_store(spark: SparkSession, store_path: str | None) -> DataFrame:
    """The store export (``STORE_EXPORT_SCHEMA``); no path means an empty store, as an empty
    local relation: the optimizer then drops the store's aggregate and join (and their stage)."""
    if not store_path:
        return log_facts.local_frame(
            spark, [], [(f.name, f.dataType.simpleString()) for f in STORE_EXPORT_SCHEMA.fields]
        )
    return spark.read.schema(STORE_EXPORT_SCHEMA).parquet(store_path)


def _as_datetime(moment: datetime | str | None) -> datetime:
    if moment is None:
        return datetime.now(UTC)
    if isinstance(moment, str):
        moment = datetime.fromisoformat(moment.replace("Z", "+00:00"))
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def run_audit(
    spark: SparkSession,
    date: date | str,
    producer_logs: str,
    consumer_logs: str,
    store_path: str | None,
    bindings: list[dict],
    grace: timedelta | int = 60,
    sla_ms: int = 5000,
    now: datetime | str | None = None,
    spans: str | None = None,
    trace: dict | None = None,
) -> dict[str, DataFrame]:
    """Reconcile one UTC day. ``grace`` is a timedelta or minutes; ``now`` defaults to the clock.
    ``spans``: the OpenTelemetry span rows' directory (``AUDIT_SPANS``), read beside the logs
    (``read_span_facts``); None or no file of the day: the logs alone, as before.
    ``trace``: the broker's firehose records (``spark/trace_facts.py``), a dict of ``path``
    (``AUDIT_TRACE``), ``gaps`` (the tap's trace_gaps over the days read, as
    ``recovery.broker.trace.coverage_gaps`` gives them), ``queued`` (gaps of the queues holding
    messages when the audit ran: those of traced groups count) and ``ignored_queues``.

    Reads producer logs from (day - max(1h, grace)) to (day end + grace) and consumer logs from the
    day start to (day end + grace). Returns the DataFrames named in ``OUTPUTS``; the shared
    rollup is already computed (see ``audit_frames``).
    """
    day = date if not isinstance(date, str) else datetime.strptime(date, "%Y-%m-%d").date()
    grace = grace if isinstance(grace, timedelta) else timedelta(minutes=grace)
    grace_ms = int(grace.total_seconds() * 1000)
    now_ms = epoch_ms(_as_datetime(now))
    day_start = datetime(day.year, day.month, day.day, tzinfo=UTC)
    day_start_ms = epoch_ms(day_start)
    producer_files, consumer_files = _day_files(
        spark, producer_logs, consumer_logs, day_start, math.ceil(grace_ms / HOUR_MS)
    )
    producer_raw = read_logs(
        spark, producer_files, producer_logs, PRODUCER_LOG_SCHEMA, PRODUCER_REQUIRED
    )
    consumer_raw = read_logs(
        spark, consumer_files, consumer_logs, CONSUMER_LOG_SCHEMA, CONSUMER_REQUIRED
    )
    hours = _span_hours(day_start, math.ceil(grace_ms / HOUR_MS))
    span_files = list_log_files(spark, spans, hours) if spans else []
    trace = trace or {}
    trace_files = list_log_files(spark, trace["path"], hours) if trace.get("path") else []
    traced = []
    if span_files or trace_files:
        producer_raw, consumer_raw, traced = with_other_sources(
            spark,
            (producer_raw, consumer_raw),
            (producer_files, consumer_files),
            (span_files, spans),
            (trace_files, trace, bindings),
        )
    outputs = audit_frames(
        producer_raw,
        consumer_raw,
        read_store(spark, store_path),
        bindings,
        day_start_ms,
        grace_ms,
        sla_ms,
        now_ms,
        traced=traced,
        trace_gaps=[*(trace.get("gaps") or []), *(trace.get("queued") or [])]
        if trace_files
        else [],
    )
    outputs["manifest"] = manifest_frame(
        spark, producer_files, consumer_files, span_files, trace_files
    )
    return outputs


def _span_hours(day_start, grace_hours: int):
    """The span partitions an audit of the day reads: the producer logs' look-back to the
    grace after the day (consumer spans of the day's messages lie within it)."""
    lookback_hours = max(1, grace_hours)
    return hour_partitions(
        day_start - timedelta(hours=lookback_hours), 24 + lookback_hours + grace_hours
    )


def read_span_facts(spark: SparkSession, span_files, base: str):
    """The span rows of ``span_files`` (Parquet, ``spans.SPAN_READ_SCHEMA``'s columns by name)
    -> ``spans.span_facts``' (producer, consumer) frames."""
    rows = (
        spark.read.schema(spans_module.SPAN_READ_SCHEMA)
        .option("basePath", base)
        .parquet(*[f.path for f in span_files])
    )
    return spans_module.span_facts(rows)


def read_trace_facts(spark: SparkSession, trace_files, trace: dict, bindings: list[dict]):
    """The firehose records of ``trace_files`` -> ``trace_facts.trace_facts``' (producer,
    consumer, routes) frames; a queue's group is the one the bindings name for it."""
    rows = (
        spark.read.schema(trace_facts.TRACE_READ_SCHEMA)
        .option("basePath", trace["path"])
        .parquet(*[f.path for f in trace_files])
    )
    queue_groups = {b["queue"]: b["consumer_group"] for b in bindings if b.get("queue")}
    return trace_facts.trace_facts(rows, queue_groups, trace.get("ignored_queues") or ())


def with_other_sources(spark, raw, files, span_input, trace_input):
    """The logs' frames with the span and trace facts no stronger source describes
    (``spans.strongest_first``: producer log > trace > span, consumer log > span > trace),
    each with its ``source``, and the broker's ``traced`` expectations. ``raw``, ``files``:
    (producer, consumer) frames and files of the logs; ``span_input``: (files, base);
    ``trace_input``: (files, ``run_audit``'s trace dict, bindings). Computed once here (the
    spans' nesting joins, the merges) and checkpointed: the summary, the main pass and the
    exact path read them."""
    (producer_raw, consumer_raw), (producer_files, consumer_files) = raw, files
    span_files, span_base = span_input
    trace_files, trace, bindings = trace_input
    producers = [spans_module.with_source(producer_raw)] if producer_files else []
    consumers = [spans_module.with_source(consumer_raw)] if consumer_files else []
    span_frames = read_span_facts(spark, span_files, span_base) if span_files else None
    traced = []
    if trace_files:
        trace_producers, trace_consumers, routes = read_trace_facts(
            spark, trace_files, trace, bindings
        )
        producers.append(trace_producers)
        # each traced group's queue: the one the bindings name for it, else its own name
        queue_of = {b["consumer_group"]: b["queue"] for b in bindings if b.get("queue")}
        traced = trace_facts.traced_expectations(trace_facts.route_runs(routes), queue_of)
    if span_frames:
        producers.append(span_frames[0])
        consumers.append(span_frames[1])
    if trace_files:
        consumers.append(trace_consumers)
    empty = spans_module.empty_span_frames(spark)
    frames = (
        spans_module.strongest_first(producers or [empty[0]], ("message_id",)),
        spans_module.strongest_first(consumers or [empty[1]], ("message_id", "consumer_group")),
    )
    return (
        *(
            frame.localCheckpoint(eager=True, storageLevel=StorageLevel.MEMORY_AND_DISK)
            for frame in frames
        ),
        traced,
    )


def _day_files(
    spark: SparkSession, producer_logs: str, consumer_logs: str, day_start, grace_hours: int
) -> tuple[list[str], list[str]]:
    """The log files an audit of the day reads: producer hours from max(1 h, grace) before the
    day to the grace after it, consumer hours from the hour before the day to the grace after."""
    lookback_hours = max(1, grace_hours)
    producer_files = list_log_files(
        spark,
        producer_logs,
        hour_partitions(
            day_start - timedelta(hours=lookback_hours), 24 + lookback_hours + grace_hours
        ),
    )
    consumer_files = list_log_files(
        spark, consumer_logs, hour_partitions(day_start - timedelta(hours=1), 25 + grace_hours)
    )
    return producer_files, consumer_files


def audit_frames(
    producer_raw: DataFrame,
    consumer_raw: DataFrame,
    store: DataFrame,
    bindings: list[dict],
    day_start_ms: int,
    grace_ms: int,
    sla_ms: int,
    now_ms: int,
    fold: bool | None = None,
    traced: list = (),
    trace_gaps: list = (),
) -> dict[str, DataFrame]:
    """The audit over parsed inputs (``read_logs`` frames, store export, bindings entries):
    the day's rollup (``audit_rollup``), then every output read from it (``audit_outputs``).
    ``fold`` forces the rollup's path (``rollup.takes_fold``; None, the default, lets the day
    choose): for a test to run one day through both paths and compare every output.
    ``traced``, ``trace_gaps``: the broker's expectations and the tap's gaps (``run_audit``)."""
    facts, rolled, listed = audit_rollup(
        producer_raw,
        consumer_raw,
        store,
        bindings,
        day_start_ms,
        grace_ms,
        now_ms,
        fold,
        traced=traced,
        trace_gaps=trace_gaps,
    )
    return audit_outputs(facts, rolled, listed, day_start_ms, grace_ms, sla_ms, now_ms)


def audit_rollup(
    producer_raw: DataFrame,
    consumer_raw: DataFrame,
    store: DataFrame,
    bindings: list[dict],
    day_start_ms: int,
    grace_ms: int,
    now_ms: int,
    fold: bool | None = None,
    traced: list = (),
    trace_gaps: list = (),
) -> tuple[log_facts.LogFacts, DataFrame, dict[str, int]]:
    """The day's facts, its rollup and the rows each evidence output lists.

    One small job summarises both logs onto the driver (``spark/log_facts.py``); then the
    rollup (``spark/rollup.py``). When the rollup shows groups consuming keys no binding names for
    them, those become ``observed`` expectations and the rollup is built again with them: a
    second pass only for the days that need it (a day whose consumers are all bound costs one,
    and does not even look: ``LogFacts.unbound_possible``). ``fold``: as ``audit_frames``'.
    """
    summary = log_facts.log_summary(producer_raw, consumer_raw).collect()
    facts = log_facts.LogFacts.from_summary(
        summary, bindings, day_start_ms, grace_ms, now_ms, traced=traced, trace_gaps=trace_gaps
    )
    # A first pass that finds any unbound pair is followed by a second one, so it need not
    # list evidence on those pairs: without bindings that would be a row per message, rolled
    # up and checkpointed only to be thrown away. Without any, it lists everything it must.
    rolled, listed = rollup.rolled(
        facts,
        producer_raw,
        consumer_raw,
        store,
        day_start_ms,
        grace_ms,
        now_ms,
        unbound_evidence=not facts.unbound_possible,
        fold=fold,
    )
    # Only a day where some group logged lines of a key no binding names it for can have any.
    spans = rollup.observed_spans(rolled) if facts.unbound_possible else []
    if spans:
        facts = log_facts.LogFacts.from_summary(
            summary,
            bindings,
            day_start_ms,
            grace_ms,
            now_ms,
            observed=expectations.observed_expectations(spans),
            traced=traced,
            trace_gaps=trace_gaps,
        )
        rolled, listed = rollup.rolled(
            facts, producer_raw, consumer_raw, store, day_start_ms, grace_ms, now_ms, fold=fold
        )
    return facts, rolled, listed


def audit_outputs(
    facts: log_facts.LogFacts,
    rolled: DataFrame,
    listed: dict[str, int],
    day_start_ms: int,
    grace_ms: int,
    sla_ms: int,
    now_ms: int,
) -> dict[str, DataFrame]:
    """Every output but the manifest, from ``audit_rollup``'s facts, rollup and listed rows."""
    spark = rolled.sparkSession
    by_key, overall = metrics.nearest_rank_quantiles(
        metrics.histogram_rows(metrics.latency_histogram(rolled).toArrow())
    )
    malformed_by_hour, hours, gaps = _input_frames(spark, facts, day_start_ms)
    provenance = log_facts.local_frame(
        spark,
        [
            *facts.provenance,
            # where the broker's routing and the bindings differ: the broker's is taken
            *[
                (ex, rk, group, expectations.SPAN_START, expectations.SPAN_END, f"differs: {what}")
                for ex, rk, group, what in facts.trace_differences
            ],
        ],
        log_facts.PROVENANCE_COLUMNS,
    )
    outputs = {
        "windows": metrics.window_metrics(
            rolled,
            log_facts.local_frame(spark, by_key, metrics.QUANTILE_COLUMNS),
            hours,
            grace_ms,
            sla_ms,
            now_ms,
        ),
        "totals": metrics.totals(
            rolled,
            overall,
            sum(malformed_by_hour.values()),
            len(facts.gaps),
            len(facts.missing_logs),
            grace_ms,
            sla_ms,
            now_ms,
        ),
        "lost": evidence.lost_evidence(
            evidence.listing(rolled, listed, "lost"), facts.provenance, day_start_ms
        ),
        "duplicates": evidence.duplicate_evidence(evidence.listing(rolled, listed, "duplicates")),
        "orphans": evidence.orphan_evidence(evidence.listing(rolled, listed, "orphans")),
        "unclaimed": evidence.unclaimed_evidence(evidence.listing(rolled, listed, "unclaimed")),
        "recoverable": evidence.recoverable_evidence(
            evidence.listing(rolled, listed, "recoverable")
        ),
        "received_unknown": evidence.received_unknown_evidence(
            evidence.listing(rolled, listed, "received_unknown")
        ),
        "input_gaps": evidence.gap_evidence(gaps),
        "expectations": provenance.selectExpr(
            "exchange",
            "routing_key",
            "consumer_group",
            "source",
            f"CASE WHEN from_ms > {expectations.SPAN_START} THEN timestamp_millis(from_ms) END "
            "AS expected_from",
            f"CASE WHEN until_ms < {expectations.SPAN_END} THEN timestamp_millis(until_ms) END "
            "AS expected_until",
        ),
    }
    if facts.has_other_sources:  # each evidence row names what it was read from (log, span, ...)
        for name in ("lost", "duplicates", "orphans", "unclaimed", "recoverable"):
            outputs[name] = evidence.with_sources(outputs[name], facts.sources)
        outputs["received_unknown"] = evidence.with_sources(
            outputs["received_unknown"], facts.sources
        )
    return outputs


def _input_frames(spark, facts, day_start_ms):
    """What the logs' summary says about the inputs, as small frames: per hour of the day the
    malformed lines, input gaps and missing consumer logs; and the gaps themselves (with, as
    process null, the groups that wrote no line where they were expected)."""
    malformed_by_hour = defaultdict(int)
    for window_ms, lines in facts.malformed:
        malformed_by_hour[window_ms] += lines
    gaps_by_hour = Counter(gap[3] for gap in facts.gaps)
    missing_by_hour = Counter(window for window, _ in facts.missing_logs)
    day_hours = range(day_start_ms, day_start_ms + 24 * HOUR_MS, HOUR_MS)
    hours = log_facts.local_frame(
        spark,
        [(h, malformed_by_hour[h], gaps_by_hour[h], missing_by_hour[h]) for h in day_hours],
        [
            ("window_ms", "bigint"),
            ("malformed_lines", "bigint"),
            ("input_gaps", "bigint"),
            ("missing_consumer_logs", "bigint"),
        ],
    )
    gaps = log_facts.local_frame(
        spark,
        facts.gaps + [("consumer", None, group, window) for window, group in facts.missing_logs],
        [
            ("source", "string"),
            ("process", "string"),
            ("consumer_group", "string"),
            ("hour_ms", "bigint"),
        ],
    )
    return malformed_by_hour, hours, gaps


def manifest_frame(
    spark: SparkSession, producer_files, consumer_files, span_files=(), trace_files=()
) -> DataFrame:
    """The input manifest: every file read, with its size (rows are in ``totals``)."""
    rows = [("producer", f.path, f.size) for f in producer_files]
    rows += [("consumer", f.path, f.size) for f in consumer_files]
    rows += [("span", f.path, f.size) for f in span_files]
    rows += [("trace", f.path, f.size) for f in trace_files]
    return log_facts.local_frame(
        spark, rows, [("source", "string"), ("path", "string"), ("bytes", "bigint")]
    )


def totals_dict(totals: DataFrame) -> dict:
    return totals.first().asDict()


def write_outputs(outputs: dict[str, DataFrame], out_dir: str) -> dict:
    """Write every output as Parquet under ``out_dir``; returns the totals as a dict."""

    def write(name: str) -> int:
        # Counted while written (an observed metric of the write job, not a second job
        # reading it again) so the reader can tell a complete output from one whose parts
        # executors wrote to disks it cannot see.
        written = Observation(f"{name}_rows")
        outputs[name].observe(written, F.count(F.lit(1)).alias("rows")).write.mode(
            "overwrite"
        ).parquet(os.path.join(out_dir, name))
        return written.get["rows"]

    # The outputs are small, independent jobs over the checkpointed rollup (one task each):
    # submitted side by side, they keep every core busy and overlap their planning and code
    # generation on the driver. Each job keeps the caller's job group, properties and tags (a
    # copy of its own: a running query sets its execution id there).
    names = [name for name in OUTPUTS if name not in ("totals", "manifest")]
    spark = outputs[names[0]].sparkSession

    def inherit(target):
        return inheritable_thread_target(spark)(target)

    workers = max(2, min(len(names), spark.sparkContext.defaultParallelism))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {name: pool.submit(inherit(write), name) for name in names}
        totals_future = pool.submit(inherit(totals_dict), outputs["totals"])
        rows = {name: future.result() for name, future in futures.items()}
        totals = totals_future.result()
    manifest = [row.asDict() for row in outputs["manifest"].collect()]
    local = out_dir.removeprefix("file://")
    if "://" not in local:  # JSON summaries beside the Parquet when the output is local
        os.makedirs(local, exist_ok=True)
        with open(os.path.join(local, "totals.json"), "w", encoding="utf-8") as fh:
            json.dump(totals, fh, indent=2, sort_keys=True)
        with open(os.path.join(local, "manifest.json"), "w", encoding="utf-8") as fh:
            json.dump(manifest, fh, indent=2)
        with open(os.path.join(local, "rows.json"), "w", encoding="utf-8") as fh:
            json.dump(rows, fh, indent=2, sort_keys=True)
    return totals


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--date", required=True, help="UTC day to audit, YYYY-MM-DD")
    parser.add_argument("--producer-logs", required=True)
    parser.add_argument("--consumer-logs", required=True)
    parser.add_argument("--store", help="Parquet export of the recovery store slice")
    parser.add_argument("--spans", help="OpenTelemetry span rows (AUDIT_SPANS), beside the logs")
    parser.add_argument("--bindings", required=True, help="JSON list of bindings")
    parser.add_argument(
        "--trace",
        help="JSON file: the broker's trace (path, gaps, ignored_queues; spark/trace_facts.py)",
    )
    parser.add_argument("--out", required=True)
    parser.add_argument("--grace-minutes", type=int, default=60)
    parser.add_argument("--sla-ms", type=int, default=5000)
    parser.add_argument("--now", help="ISO timestamp deciding FINAL vs PROVISIONAL (default: now)")
    parser.add_argument("--master", help="Spark master (default: spark-submit's, else local[*])")
    return parser.parse_args(argv)


def _read_json(path: str):
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def main(argv=None) -> int:
    args = parse_args(argv)
    builder = SparkSession.builder.appName(f"lazarus-audit-{args.date}").config(
        "spark.sql.session.timeZone", "UTC"
    )
    if args.master:
        builder = builder.master(args.master)
    owns_session = SparkSession.getActiveSession() is None
    spark = builder.getOrCreate()
    try:
        outputs = run_audit(
            spark,
            args.date,
            args.producer_logs,
            args.consumer_logs,
            args.store,
            load_bindings(args.bindings),
            grace=args.grace_minutes,
            sla_ms=args.sla_ms,
            now=args.now,
            spans=args.spans,
            trace=_read_json(args.trace) if args.trace else None,
        )
        totals = write_outputs(outputs, args.out)
        print(json.dumps(totals, sort_keys=True))
    finally:
        spark.catalog.clearCache()
        if owns_session:
            spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
