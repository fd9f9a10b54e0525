"""The audit of a day from OpenTelemetry spans only (#47) against the bare Spark loss query over
the same spans.

Generates N producer spans and ~N consumer spans (0.1 % never consumed, 0.5 % consumed twice,
as bench/audit.py's logs) in the intake's span rows (``spark/spans.py``'s read schema: the
columns ``recovery/telemetry/schema.py`` writes that the audit reads), Parquet by dt=/hour=;
each consumer span a child of its producer span, current-convention operations, one bound
group. Then in ONE Spark session (the audit's 8 shuffle partitions), ``--rounds`` times: the
bare query (producer spans left-joined to consumer spans by message id, per hour: published,
never consumed, extra deliveries), then the full audit (``spark.audit.run_audit`` with no log
file, ``spans=`` the directory, + ``write_outputs``). Prints each round, the median and the best
of audit / baseline (target <= 1.2), and the Spark JVM's CPU of each. Prints, never asserts.

Usage: python bench/audit_spans.py [N=10000000] [--rounds 3] [--dir /tmp/lazarus-bench-spans]
"""

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench.audit import (  # noqa: E402
    BINDINGS,
    DAY,
    HOUR_MS,
    T0,
    bench_session,
    figures,
    jvm_cpu_seconds,
    median,
)

BASELINE_SQL = """
WITH p AS (SELECT message_id, min(start_ns) ts FROM spans WHERE kind = 'producer'
           GROUP BY message_id),
     c AS (SELECT message_id, count(*) n FROM spans WHERE kind = 'consumer' GROUP BY message_id)
SELECT CAST(floor(p.ts / 3600000000000) AS BIGINT) AS hr, count(*) published,
       sum(CASE WHEN c.n IS NULL THEN 1 ELSE 0 END) lost,
       sum(CASE WHEN c.n > 1 THEN c.n - 1 ELSE 0 END) dup_deliveries
FROM p LEFT JOIN c ON p.message_id = c.message_id GROUP BY 1 ORDER BY 1
"""

LINK = pa.struct([("trace_id", pa.string()), ("span_id", pa.string())])


def _empty_lists(n):
    return pa.ListArray.from_arrays(pa.array(np.zeros(n + 1, np.int32)), pa.array([], LINK))


def _empty_maps(n):
    return pa.MapArray.from_arrays(
        pa.array(np.zeros(n + 1, np.int32)), pa.array([], pa.string()), pa.array([], pa.string())
    )


def _hex(values, width):
    return np.char.mod(f"%0{width}x", values)


def _table(
    kind, trace_ids, span_ids, parents, start_ms, services, operation, exchanges, ids, groups
):
    n = len(ids)
    hours = (start_ms - T0) // HOUR_MS
    return pa.table(
        {
            "trace_id": trace_ids,
            "span_id": span_ids,
            "parent_span_id": parents if parents is not None else pa.nulls(n, pa.string()),
            "links": _empty_lists(n),
            "kind": np.full(n, kind),
            "start_ns": start_ms * 1_000_000,
            "status_code": np.full(n, "unset"),
            "service_name": services,
            "service_instance": pa.nulls(n, pa.string()),
            "operation": np.full(n, operation),
            "destination": exchanges,
            "routing_key": np.full(n, "rk"),
            "message_id": ids,
            "consumer_group": groups if groups is not None else pa.nulls(n, pa.string()),
            "attributes": _empty_maps(n),
            "dt": np.full(n, DAY),
            "hour": np.char.zfill(hours.astype(str), 2),
        }
    )


def generate(directory, n):
    """Writes the spans; returns the injected truth."""
    if os.path.exists(f"{directory}/truth.json"):
        with open(f"{directory}/truth.json") as fh:
            return json.load(fh)
    shutil.rmtree(directory, ignore_errors=True)
    rng = np.random.default_rng(7)
    seq = np.arange(n)
    ids = np.char.add("m-", seq.astype(str))
    trace_ids = _hex(seq, 32)
    producer_spans = _hex(2 * seq + 1, 16)
    pts = T0 + np.sort(rng.integers(0, 24 * HOUR_MS - 10_000, n))
    exchange = np.where(rng.random(n) < 0.5, "orders", "payments")
    services = np.where(exchange == "orders", "orders-svc", "payments-svc")
    producer = _table(
        "producer", trace_ids, producer_spans, None, pts, services, "send", exchange, ids, None
    )
    pq.write_to_dataset(producer, f"{directory}/spans", partition_cols=["dt", "hour"])
    del producer
    keep = rng.random(n) >= 0.001
    dup = rng.random(n) < 0.005
    take = np.concatenate([seq[keep], seq[keep & dup]])
    m = take.size
    cts = pts[take] + rng.integers(1, 5000, m)
    consumer = _table(
        "consumer",
        trace_ids[take],
        _hex(2 * n + np.arange(m) + 1, 16),
        producer_spans[take],
        cts,
        np.full(m, "g"),
        "process",
        exchange[take],
        ids[take],
        np.full(m, "g"),
    )
    pq.write_to_dataset(consumer, f"{directory}/spans", partition_cols=["dt", "hour"])
    truth = {"published": n, "lost": int((~keep).sum()), "dup_deliveries": int((keep & dup).sum())}
    with open(f"{directory}/truth.json", "w") as fh:
        json.dump(truth, fh)
    return truth


def bare_query(spark, directory):
    cpu, t = jvm_cpu_seconds(spark), time.perf_counter()
    spark.read.parquet(f"{directory}/spans").createOrReplaceTempView("spans")
    rows = spark.sql(BASELINE_SQL).collect()
    seconds = time.perf_counter() - t
    return seconds, tuple(sum(r[i] for r in rows) for i in (1, 2, 3)), jvm_cpu_seconds(spark) - cpu


def full_audit(spark, directory):
    from spark.audit import run_audit, write_outputs

    out = tempfile.mkdtemp(prefix="lazarus-audit-spans-out-")
    empty = tempfile.mkdtemp(prefix="lazarus-audit-no-logs-")
    cpu, t = jvm_cpu_seconds(spark), time.perf_counter()
    outputs = run_audit(
        spark,
        DAY,
        f"{empty}/producer",
        f"{empty}/consumer",
        None,
        BINDINGS["bound"],
        grace=60,
        now="2026-09-25T00:00:00Z",
        spans=f"{directory}/spans",
    )
    totals = write_outputs(outputs, out)
    seconds, cpu = time.perf_counter() - t, jvm_cpu_seconds(spark) - cpu
    spark.catalog.clearCache()
    shutil.rmtree(out)
    shutil.rmtree(empty)
    return seconds, totals, cpu


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("n", nargs="?", type=lambda v: int(float(v)), default=10_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default="/tmp/lazarus-bench-spans")
    args = parser.parse_args()
    t = time.perf_counter()
    truth = generate(f"{args.dir}/{args.n}", args.n)
    small = min(args.n, 100_000)
    generate(f"{args.dir}/{small}", small)
    print(f"generated {args.n:,} publishes as spans in {time.perf_counter() - t:.1f} s: {truth}")

    spark = bench_session()
    bare_query(spark, f"{args.dir}/{small}")  # warm the JVM for both
    full_audit(spark, f"{args.dir}/{small}")
    base_s, audit_s, ratios, base_cpu, audit_cpu = [], [], [], [], []
    directory = f"{args.dir}/{args.n}"
    for r in range(1, args.rounds + 1):
        seconds, base_totals, cpu = bare_query(spark, directory)
        base_s.append(seconds)
        base_cpu.append(cpu)
        a_seconds, totals, a_cpu = full_audit(spark, directory)
        audit_s.append(a_seconds)
        audit_cpu.append(a_cpu)
        ratios.append(a_seconds / seconds)
        print(
            f"round {r}  load {os.getloadavg()[0]:4.1f}  baseline {seconds:7.2f} s (published, "
            f"lost, dups) {base_totals}  audit {a_seconds:7.2f} s  audit/baseline "
            f"{ratios[-1]:.2f}  sent {totals.get('sent')} lost_confirmation_unknown "
            f"{totals.get('lost_confirmation_unknown')} dup_deliveries "
            f"{totals.get('dup_deliveries')} (truth {truth})",
            flush=True,
        )
    print(f"baseline seconds: {figures(base_s, '{:.1f}')}")
    print(f"audit seconds:    {figures(audit_s, '{:.1f}')}")
    print(
        f"audit / baseline: median {median(ratios):.2f}, best {min(ratios):.2f} of {len(ratios)} "
        "rounds (target <= 1.2)"
    )
    print(f"JVM CPU audit / baseline: {median(audit_cpu) / median(base_cpu):.2f} (medians)")


if __name__ == "__main__":
    main()
