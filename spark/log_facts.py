"""The logs' small facts: everything the audit needs from the logs besides their lines.

``log_summary`` is the one Spark job: line counts per log, process, file hour, malformed flag and
a few keys, as small as processes x hours x keys. ``LogFacts.from_summary`` derives the rest on
the driver in plain Python: the consumer groups each (exchange, routing key) is expected to
reach and when (``spark/expectations.py``: bindings history, configuration, observation), the
input gaps and the groups that wrote no line where they were expected, malformed lines per hour
and which queue belongs to which group. ``local_frame`` hands such rows back to Spark as a local
relation, which a broadcast join reads without a job.
Definitions: the docstring of ``spark/transforms.py``.
"""

import math
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime

from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from spark.expectations import (
    SPAN_END,
    SPAN_START,
    WORD_BITS,
    Expectation,
    key_expectations,
    trace_differences,
)
from spark.schema import HOUR_MS


def key_hash() -> Column:
    """The id of a line's (exchange, routing key): what the per-message aggregate carries."""
    return F.xxhash64("exchange", F.coalesce("routing_key", F.lit("")))


def group_hash() -> Column:
    return F.xxhash64("consumer_group")


def log_summary(producer_raw: DataFrame, consumer_raw: DataFrame) -> DataFrame:
    """Line counts per (source, process, file hour, keys) of both logs: every line
    (``malformed`` null) and, in rows of their own, the malformed ones (``malformed`` true).

    Counting every line reads only the few low-cardinality columns the keys need; counting the
    malformed ones filters on null checks and comparisons the Parquet reader answers from its
    row-group statistics, so neither reads the message ids. ``LogFacts.from_summary`` takes
    the difference. Each of the four counts is its own aggregate, fused with its scan (a union
    below one aggregate would hand every line to it as a row of its own: half again the CPU at
    10M lines), and their few rows are the union (one job besides the collect): a log's two
    keys travel as ``a`` and ``b`` (the producer's exchange and routing key, the consumer's
    group and queue). The hashes are computed on the counted rows, not on every line."""

    def lines(frame: DataFrame, process: str, a: str, b: Column, acked: Column) -> DataFrame:
        # where the lines come from (spark/spans.py: "log" or "span"), for the evidence
        origin = F.col("source") if "source" in frame.columns else F.lit("log")
        keys = [
            F.col(process).alias("process"),
            "file_hour_ms",
            F.col(a).alias("a"),
            b.alias("b"),
            origin.alias("origin"),
        ]
        source = F.lit("producer" if process == "producer" else "consumer").alias("source")

        def count(rows: DataFrame, malformed: Column) -> DataFrame:
            return (
                rows.groupBy(*keys)
                .agg(F.count(F.lit(1)).alias("lines"), F.count_if(acked).alias("acked"))
                .select(
                    source,
                    malformed.alias("malformed"),
                    "process",
                    "file_hour_ms",
                    "a",
                    "b",
                    "lines",
                    "acked",
                    "origin",
                )
            )

        return count(frame, F.lit(None).cast("boolean")).unionByName(
            count(frame.where("malformed"), F.lit(True))
        )

    counted = lines(
        producer_raw,
        "producer",
        "exchange",
        F.coalesce("routing_key", F.lit("")),
        # a span's publish (``sent``) expects its groups as an acked line does
        F.col("outcome").isin("ack", "sent"),
    ).unionByName(
        lines(
            consumer_raw,
            "consumer",
            "consumer_group",
            F.col("queue"),
            F.lit(None).cast("boolean"),
        )
    )
    producer = "source = 'producer'"
    return counted.selectExpr(
        "source",
        "process",
        "file_hour_ms",
        f"CASE WHEN {producer} THEN a END AS exchange",
        f"CASE WHEN {producer} THEN b END AS routing_key",
        f"CASE WHEN {producer} THEN acked END AS acked",
        f"CASE WHEN {producer} THEN xxhash64(a, b) END AS key_hash",
        f"CASE WHEN NOT {producer} THEN a END AS consumer_group",
        f"CASE WHEN NOT {producer} THEN b END AS queue",
        f"CASE WHEN NOT {producer} THEN xxhash64(a) END AS group_hash",
        "lines",
        "malformed",
        "origin",
    )


def valid_and_malformed(summary) -> tuple[list, list]:
    """``log_summary`` rows -> (rows of valid lines, rows of malformed lines), each with
    ``lines``: the valid count of a key is its count of every line less its malformed one."""
    bad = [row for row in summary if row.malformed]
    key = (
        "source",
        "process",
        "file_hour_ms",
        "exchange",
        "routing_key",
        "consumer_group",
        "queue",
        "origin",
    )
    less = defaultdict(lambda: [0, 0])
    for row in bad:
        counts = less[tuple(row[k] for k in key)]
        counts[0] += row.lines
        counts[1] += row.acked or 0
    valid = []
    for row in summary:
        if row.malformed is None:
            bad_lines, bad_acked = less[tuple(row[k] for k in key)]
            lines = row.lines - bad_lines
            if lines > 0:
                acked = (row.acked or 0) - bad_acked
                valid.append(
                    Row(**{**row.asDict(), "malformed": False, "lines": lines, "acked": acked})
                )
    return valid, bad


def _distinct_ids(pairs, what: str) -> None:
    seen = {}
    for name, value in pairs:
        if seen.setdefault(value, name) != name:
            raise ValueError(
                f"the {what} {seen[value]!r} and {name!r} share a 64-bit hash: the audit cannot "
                "tell them apart; rename one"
            )


def _covers_all_time(spans) -> bool:
    """Whether [from, until) spans leave no time uncovered (a message first published in a
    hole has no bound groups: any group's line of it is unbound consumption)."""
    reached = SPAN_START
    for lo, hi in sorted(spans):
        if lo > reached:
            return False
        reached = max(reached, hi)
    return reached >= SPAN_END


def input_gaps(hours, first_hour_ms: int, end_hour_ms: int) -> list[tuple]:
    """Hours in [first, end) where a process's log has a hole: a file the hour before, none in
    the hour, and a file again later. A process that stops for good (shutdown, scale-in) leaves
    no hole; its unconsumed messages are reported as what they look like.

    ``hours``: (source, process, consumer_group, hour_ms) of every hour a process wrote a file.
    """
    by_process = defaultdict(set)
    for source, process, group, hour in hours:
        by_process[(source, process, group)].add(hour)
    gaps = []
    for process, present in by_process.items():
        last = max(present)
        for hour in present:
            missing = hour + HOUR_MS
            if missing not in present and missing < last and first_hour_ms <= missing < end_hour_ms:
                gaps.append((*process, missing))
    return sorted(gaps, key=lambda g: (g[3], g[0], g[1], g[2] or ""))


def _utc(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def trace_gap_rows(
    trace_gaps, groups, first_hour_ms: int, end_hour_ms: int, group_of=None
) -> list[tuple]:
    """The tap's trace_gaps (dicts of kind, node, from_ms, until_ms) as input gaps of each
    traced group: one (``"trace"``, what, group, hour_ms) per hour a gap touches in [first,
    end). A trace record lost in a gap is a delivery of a traced group the audit cannot see, so
    its pairs of every window whose deadline passes the hour are ``unverified`` (``gap_windows``),
    never lost and never fine. (A lost publish record leaves no message to count.) A gap that
    names a ``queue`` (``queued``: it held messages when the audit ran) is its group's only
    (``group_of``: queue -> group, else the queue's own name), when that group is traced."""
    group_of = group_of or {}
    rows = set()
    for gap in trace_gaps:
        what = f"trace_gap {gap['kind']} {_utc(gap['from_ms'])}..{_utc(gap['until_ms'])}"
        if gap.get("node"):
            what += f" {gap['node']}"
        hit = groups
        if gap.get("queue"):
            what += f" {gap['queue']} held {gap.get('messages')}"
            group = group_of.get(gap["queue"], gap["queue"])
            hit = [group] if group in groups else []
        hour = gap["from_ms"] - gap["from_ms"] % HOUR_MS
        while hour < gap["until_ms"]:
            if first_hour_ms <= hour < end_hour_ms:
                rows.update(("trace", what, group, hour) for group in hit)
            hour += HOUR_MS
    return sorted(rows, key=lambda g: (g[3], g[0], g[1], g[2] or ""))


def gap_windows(gaps, grace_ms: int) -> list[tuple]:
    """(window_ms, consumer_group) whose pairs an input gap hides; a null group = every group.

    A consumer gap at hour H hides deliveries of every window W with W <= H < W + 1h + grace."""
    hours_back = (HOUR_MS + grace_ms - 1) // HOUR_MS
    windows = set()
    for source, _, group, hour in gaps:
        if source == "producer":
            windows.add((hour, None))
        else:
            windows.update((hour - back * HOUR_MS, group) for back in range(hours_back + 1))
    return sorted(windows, key=lambda w: (w[0], w[1] or ""))


def _log_gaps(summary, day_start_ms: int, day_end_ms: int, grace_ms: int) -> list[tuple]:
    """The input gaps of the day: producer hours of the day, consumer hours up to the grace.
    The broker's trace records are not a process's log: their completeness is the tap's
    coverage (``trace_gap_rows``), and a client silent for an hour is no hole in them."""
    hours = {
        (r.source, r.process, r.consumer_group, r.file_hour_ms)
        for r in summary
        if r.process is not None and r.malformed is None and r.origin != "trace"
    }
    grace_hours = math.ceil(grace_ms / HOUR_MS)
    return input_gaps(
        [h for h in hours if h[0] == "producer"], day_start_ms, day_end_ms
    ) + input_gaps(
        [h for h in hours if h[0] == "consumer"],
        day_start_ms,
        day_end_ms + grace_hours * HOUR_MS,
    )


@dataclass(frozen=True)
class LogFacts:
    keys: list[tuple]  # (key_hash, exchange, routing_key) of every producer key
    # (key_hash, from_ms, until_ms, expected_0.., bound_0..): per key and time span, the groups
    # expected (bitmask) and the groups any binding or configuration names for the key that day
    expectations: list[tuple]
    # (exchange, routing_key, consumer_group, from_ms, until_ms, source): where each expected
    # group of a key comes from, for the evidence
    provenance: list[tuple]
    bit_groups: list[str]  # every group a bitmask can name; its bit = its index
    bound_groups: list[str]  # the groups a binding or the configuration names
    words: int
    gaps: list[tuple]  # (source, process, consumer_group, hour_ms); process null: no log at all
    gap_windows: list[tuple]  # (window_ms, consumer_group)
    missing_logs: list[tuple]  # (window_ms, consumer_group): expected, confirmed, no line
    malformed: list[tuple]  # (window_ms, lines) of the audited day
    queue_groups: list[tuple]  # (queue, consumer_group) from the consumer logs and the bindings
    groups: list[str]  # every group of the consumer logs or the bindings
    # Valid producer lines, and those whose key is bound to several groups plus the consumer
    # lines of groups no binding names: how many messages may have lines from several groups.
    producer_lines: int = 0
    multi_group_lines: int = 0
    # Whether a group that logged lines has a producer key no binding or configuration names
    # it for: only then can the rollup show unbound consumption (and observed expectations).
    unbound_possible: bool = True
    # (side, exchange or group, routing key or null, "log" | "span" | "trace" | "log+span" |
    # ...): what the audit read for each producer key and consumer group (the evidence's sources)
    sources: tuple = ()
    # (exchange, routing_key, group, what): where the bindings and the broker's routing differ
    trace_differences: tuple = ()

    @property
    def has_other_sources(self) -> bool:
        """Whether anything but the log contract was read (spans, the broker's trace)."""
        return any(src != "log" for *_, src in self.sources)

    @classmethod
    def from_summary(
        cls,
        summary,
        bindings: list[dict],
        day_start_ms: int,
        grace_ms: int,
        now_ms: int | None = None,
        observed: list[Expectation] = (),
        traced: list[Expectation] = (),
        trace_gaps: list[dict] = (),
    ) -> "LogFacts":
        """``summary``: the collected rows of ``log_summary``; ``bindings``: the bindings
        entries (``Expectation.from_binding``); ``observed``: the expectations the consumer
        logs showed (a second pass, ``spark/audit.py``); ``now_ms``: windows whose deadline
        has passed are checked for groups that wrote no line (null: none are); ``traced``: the
        broker's expectations (``spark/trace_facts.py``), which replace the others of the keys
        they name; ``trace_gaps``: the tap's gaps (``trace_gap_rows``)."""
        day_end_ms = day_start_ms + 24 * HOUR_MS
        valid, bad = valid_and_malformed(summary)
        producer = [row for row in valid if row.source == "producer"]
        consumer = [row for row in valid if row.source == "consumer"]
        _distinct_ids({(r.exchange, r.routing_key): r.key_hash for r in producer}.items(), "keys")
        _distinct_ids({r.consumer_group: r.group_hash for r in consumer}.items(), "groups")

        configured = [Expectation.from_binding(b) for b in bindings]
        bound = sorted({e.consumer_group for e in configured})
        logged = {r.consumer_group for r in consumer}
        traced_groups = {e.consumer_group for e in traced}
        bit_groups = sorted(set(bound) | logged | {e.consumer_group for e in [*observed, *traced]})
        words = max(1, math.ceil(len(bit_groups) / WORD_BITS))
        keys, expectations, provenance, spans_of = key_expectations(
            producer, [*configured, *traced, *observed], bit_groups, words
        )
        # Only groups that logged lines can give a message lines of several groups: a silent
        # group beside a logging one (a missing log) leaves each message the lines of one.
        fanout = {
            hashed
            for hashed, exchange, routing_key in keys
            if len({g for g, _, _ in spans_of[(exchange, routing_key)]} & logged) > 1
        }
        multi_group_lines = sum(r.lines for r in producer if r.key_hash in fanout)
        if len(logged) > 1:
            multi_group_lines += sum(r.lines for r in consumer if r.consumer_group not in bound)
        bound_to = defaultdict(set)
        for e in [*configured, *traced]:
            matches = e.matcher()
            for _, exchange, routing_key in keys:
                if e.exchange == exchange and matches(routing_key):
                    bound_to[(exchange, routing_key)].add(e.consumer_group)
        unbound_possible = any(logged - bound_to[(ex, rk)] for _, ex, rk in keys) or not all(
            _covers_all_time([(lo, hi) for k, lo, hi, *_ in expectations if k == hashed])
            for hashed, _, _ in keys
        )
        gaps = _log_gaps(summary, day_start_ms, day_end_ms, grace_ms)
        grace_end = day_end_ms + math.ceil(grace_ms / HOUR_MS) * HOUR_MS
        gaps += trace_gap_rows(
            trace_gaps,
            sorted(traced_groups),
            day_start_ms,
            grace_end,
            {e.queue: e.consumer_group for e in configured if e.queue},
        )
        # A traced group's deliveries are the broker's word, complete where no trace_gap is: a
        # queue nobody consumed from (every message expired) is no missing log.
        missing = [
            m
            for m in missing_logs(producer, consumer, spans_of, day_start_ms, grace_ms, now_ms)
            if m[1] not in traced_groups
        ]
        malformed = defaultdict(int)
        for row in bad:
            if day_start_ms <= row.file_hour_ms < day_end_ms:
                malformed[row.file_hour_ms] += row.lines
        queue_groups = {(r.queue, r.consumer_group) for r in consumer if r.queue is not None}
        queue_groups |= {(e.queue, e.consumer_group) for e in [*configured, *traced] if e.queue}
        return cls(
            keys=keys,
            expectations=expectations,
            provenance=provenance,
            bit_groups=bit_groups,
            bound_groups=bound,
            words=words,
            gaps=gaps,
            gap_windows=sorted(
                set(gap_windows(gaps, grace_ms)) | set(missing), key=lambda w: (w[0], w[1] or "")
            ),
            missing_logs=missing,
            malformed=sorted(malformed.items()),
            queue_groups=sorted(queue_groups),
            groups=sorted(
                {r.consumer_group for r in summary if r.source == "consumer"} - {None}
                | set(bit_groups)
            ),
            producer_lines=sum(r.lines for r in producer),
            multi_group_lines=multi_group_lines,
            unbound_possible=unbound_possible,
            sources=_sources(valid),
            trace_differences=tuple(trace_differences(keys, [*configured, *traced])),
        )

    def expectation_columns(self) -> list[tuple[str, str]]:
        return [
            ("key_hash", "bigint"),
            ("from_ms", "bigint"),
            ("until_ms", "bigint"),
            *[(f"expected_{w}", "bigint") for w in range(self.words)],
            *[(f"bound_{w}", "bigint") for w in range(self.words)],
        ]


def _sources(valid) -> tuple:
    """``LogFacts.sources`` from the summary's valid rows."""
    seen = defaultdict(set)
    for row in valid:
        origin = row["origin"] or "log"
        if row.source == "producer":
            seen[("producer", row.exchange, row.routing_key)].add(origin)
        else:
            seen[("consumer", row.consumer_group, None)].add(origin)
    return tuple(
        (*key, "+".join(s for s in ("log", "span", "trace") if s in origins))
        for key, origins in sorted(seen.items(), key=lambda i: tuple(map(str, i[0])))
    )


KEY_COLUMNS = [("key_hash", "bigint"), ("exchange", "string"), ("routing_key", "string")]
PROVENANCE_COLUMNS = [
    ("exchange", "string"),
    ("routing_key", "string"),
    ("consumer_group", "string"),
    ("from_ms", "bigint"),
    ("until_ms", "bigint"),
    ("source", "string"),
]


def missing_logs(producer, consumer, spans_of, day_start_ms, grace_ms, now_ms) -> list[tuple]:
    """(window_ms, group) where the group was expected to receive confirmed messages of the
    window (acknowledged producer lines of a key in that file hour) and no consumer of it wrote
    a line from the window's start to the end of its deadline's hour: its log is missing (or
    every consumer of it was down), so its messages are ``unverified``, not lost. Only windows
    whose deadline has passed (``now_ms``)."""
    if now_ms is None:
        return []
    lines_at = defaultdict(set)
    for row in consumer:
        lines_at[row.consumer_group].add(row.file_hour_ms)
    acked = defaultdict(int)
    for row in producer:
        acked[(row.exchange, row.routing_key, row.file_hour_ms)] += row.acked or 0
    missing = set()
    for (exchange, routing_key, window), count in acked.items():
        deadline = window + HOUR_MS + grace_ms
        if not count or not day_start_ms <= window < day_start_ms + 24 * HOUR_MS:
            continue
        if deadline > now_ms:
            continue
        last_hour = deadline - deadline % HOUR_MS
        for group, lo, hi in spans_of.get((exchange, routing_key), ()):
            if lo < window + HOUR_MS and window < hi:
                heard = lines_at.get(group, set())
                if not any(window <= h <= last_hour for h in heard):
                    missing.add((window, group))
    return sorted(missing)


def sql_literal(value, sql_type: str) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        # Every character that could end or bend the literal travels as a \\u escape.
        safe = "".join(
            c if c.isascii() and (c.isalnum() or c in " _-.:/#*+@") else _unicode_escape(c)
            for c in value
        )
        return f"'{safe}'"
    if isinstance(value, (list, tuple)):
        element = sql_type.removeprefix("array<").removesuffix(">")
        items = ", ".join(sql_literal(v, element) for v in value)
        return f"CAST(array({items}) AS {sql_type})"
    raise TypeError(f"no SQL literal for {value!r}")


def _unicode_escape(char: str) -> str:
    encoded = char.encode("utf-16-be")
    return "".join(
        f"\\u{int.from_bytes(encoded[i : i + 2], 'big'):04x}" for i in range(0, len(encoded), 2)
    )


def local_frame(spark: SparkSession, rows, columns: list[tuple[str, str]]) -> DataFrame:
    """``rows`` as a local relation (``VALUES``) with ``columns`` [(name, sql type)]: broadcast
    joins read it on the driver, without the Spark job a ``createDataFrame`` frame costs."""
    names = [f"c{i}" for i in range(len(columns))]
    data = list(rows)
    where = "" if data else " WHERE false"
    data = data or [tuple(None for _ in columns)]
    values = ", ".join(
        "(" + ", ".join(sql_literal(v, t) for v, (_, t) in zip(row, columns, strict=True)) + ")"
        for row in data
    )
    select = ", ".join(
        f"CAST({c} AS {t}) AS {name}" for c, (name, t) in zip(names, columns, strict=True)
    )
    return spark.sql(f"SELECT {select} FROM VALUES {values} AS t({', '.join(names)}){where}")
