"""Full Spark audit vs the bare loss/duplicate query of ../shared/bench/audit_baseline.py.

Generates N publishes and ~N consumptions (0.1 % lost, 0.5 % delivered twice, as the baseline
does) in the log schema (docs/design.md "The log contract"), Parquet partitioned dt=/hour=, then
in ONE Spark session with the audit's shuffle partitions (settings.SPARK_SHUFFLE_PARTITIONS, 8)
for both contenders: the baseline query at N, the full audit (run_audit + write_outputs) at N,
the baseline again (the machine is shared: the ratio uses the mean of the two baselines and both
are printed), and the full audit at the small N. Prints audit/baseline (target <= 1.5), seconds
per record at the small N vs N (target growth <= 1.3x), the Spark JVM's CPU per message of both
contenders (steadier than wall time on a shared machine) and the driver's peak memory. Prints,
never asserts.

Usage: python bench/audit.py [N=10000000] [--small 1000000] [--dir /tmp/lazarus-bench-audit]
"""

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._cpu import cpu_seconds  # noqa: E402

DAY = "2026-09-21"
T0 = 1_789_948_800_000  # 2026-09-21T00:00:00Z
HOUR_MS = 3_600_000

BASELINE_SQL = """
WITH p AS (SELECT message_id, min(ts) ts FROM producer GROUP BY message_id),
     c AS (SELECT message_id, count(*) n FROM consumer GROUP BY message_id)
SELECT CAST(floor(p.ts / 3600000) AS BIGINT) AS hr, count(*) published,
       sum(CASE WHEN c.n IS NULL THEN 1 ELSE 0 END) lost,
       sum(CASE WHEN c.n > 1 THEN c.n - 1 ELSE 0 END) dup_deliveries
FROM p LEFT JOIN c ON p.message_id = c.message_id GROUP BY 1 ORDER BY 1
"""


def _partitions(ts):
    hours = (ts - T0) // HOUR_MS
    return np.full(ts.size, DAY), np.char.zfill(hours.astype(str), 2)


def generate(directory: str, n: int) -> dict:
    """Writes producer/ and consumer/ logs; returns the injected truth."""
    if os.path.exists(f"{directory}/truth.json"):
        with open(f"{directory}/truth.json") as fh:
            return json.load(fh)
    shutil.rmtree(directory, ignore_errors=True)
    rng = np.random.default_rng(7)
    ids = np.char.add("m-", np.arange(n).astype(str))
    # Stay inside the day so every message is the audited day's.
    pts = T0 + np.sort(rng.integers(0, 24 * HOUR_MS - 10_000, n))
    exchange = np.where(rng.random(n) < 0.5, "orders", "payments")
    dt, hour = _partitions(pts)
    producer = pa.table(
        {
            "v": np.ones(n, np.int32),
            "ts": pts,
            "producer": np.where(exchange == "orders", "orders-svc", "payments-svc"),
            "message_id": ids,
            "exchange": exchange,
            "routing_key": np.full(n, "rk"),
            "attempt": np.ones(n, np.int32),
            "outcome": np.full(n, "ack"),
            "confirm_ms": rng.integers(1, 20, n),
            "size": np.full(n, 512),
            "dt": dt,
            "hour": hour,
        }
    )
    pq.write_to_dataset(producer, f"{directory}/producer", partition_cols=["dt", "hour"])
    keep = rng.random(n) >= 0.001
    dup = rng.random(n) < 0.005
    cid = np.concatenate([ids[keep], ids[keep & dup]])
    cts = np.concatenate([pts[keep], pts[keep & dup]]) + rng.integers(1, 5000, cid.size)
    m = cid.size
    dt, hour = _partitions(cts)
    consumer = pa.table(
        {
            "v": np.ones(m, np.int32),
            "ts": cts,
            "consumer_group": np.full(m, "g"),
            "consumer": np.full(m, "worker-1"),
            "queue": np.full(m, "q"),
            "message_id": cid,
            "redelivered": np.zeros(m, bool),
            "outcome": np.full(m, "ack"),
            "handle_ms": rng.integers(1, 50, m),
            "dt": dt,
            "hour": hour,
        }
    )
    pq.write_to_dataset(consumer, f"{directory}/consumer", partition_cols=["dt", "hour"])
    truth = {"lost": int((~keep).sum()), "dup_deliveries": int((keep & dup).sum())}
    with open(f"{directory}/truth.json", "w") as fh:
        json.dump(truth, fh)
    return truth


SHUFFLE_PARTITIONS = 8  # console/settings.py SPARK_SHUFFLE_PARTITIONS, as recovery/audit.py passes


def jobs_since(spark, group: str) -> int:
    return len(spark.sparkContext.statusTracker().getJobIdsForGroup(group))


def jvm_cpu_seconds(spark) -> float:
    """User + system CPU of the Spark JVM (driver and executors on local[*]): what a run costs,
    steadier than its wall time on a shared machine."""
    return cpu_seconds(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())


def bare_query(spark, directory: str) -> tuple[float, tuple, float]:
    cpu, t = jvm_cpu_seconds(spark), time.perf_counter()
    spark.read.parquet(f"{directory}/producer").createOrReplaceTempView("producer")
    spark.read.parquet(f"{directory}/consumer").createOrReplaceTempView("consumer")
    rows = spark.sql(BASELINE_SQL).collect()
    seconds = time.perf_counter() - t
    return seconds, tuple(sum(r[i] for r in rows) for i in (1, 2, 3)), jvm_cpu_seconds(spark) - cpu


def full_audit(spark, directory: str) -> tuple[float, dict, int, float]:
    from spark.audit import run_audit, write_outputs

    bindings = [
        {"exchange": "orders", "routing_key": "#", "consumer_group": "g", "queue": "q"},
        {"exchange": "payments", "routing_key": "#", "consumer_group": "g", "queue": "q"},
    ]
    out = tempfile.mkdtemp(prefix="lazarus-audit-out-")
    group = f"audit-{directory}-{time.monotonic()}"
    spark.sparkContext.setJobGroup(group, "bench audit")
    cpu, t = jvm_cpu_seconds(spark), time.perf_counter()
    outputs = run_audit(
        spark,
        DAY,
        f"{directory}/producer",
        f"{directory}/consumer",
        None,
        bindings,
        grace=60,
        now="2026-09-25T00:00:00Z",
    )
    totals = write_outputs(outputs, out)
    seconds, cpu = time.perf_counter() - t, jvm_cpu_seconds(spark) - cpu
    spark.catalog.clearCache()
    spark.sparkContext.setJobGroup("bench", "bench")
    shutil.rmtree(out)
    return seconds, totals, jobs_since(spark, group), cpu


def jvm_peak_mb(spark) -> float:
    pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("n", nargs="?", type=lambda v: int(float(v)), default=10_000_000)
    parser.add_argument("--small", type=lambda v: int(float(v)), default=1_000_000)
    parser.add_argument("--dir", default="/tmp/lazarus-bench-audit")
    args = parser.parse_args()
    n, small_n, root = args.n, min(args.small, args.n), args.dir
    t = time.perf_counter()
    truth = generate(f"{root}/{n}", n)
    small_truth = generate(f"{root}/{small_n}", small_n)
    print(f"generated {n:,} (+{small_n:,}) publishes in {time.perf_counter() - t:.1f} s")

    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[*]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", "4g")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", str(SHUFFLE_PARTITIONS))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    print(f"load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    bare_query(spark, f"{root}/{small_n}")  # warm the JVM for both contenders
    full_audit(spark, f"{root}/{small_n}")

    base_s, base_totals, base_cpu = bare_query(spark, f"{root}/{n}")
    print(
        f"baseline  N={n:>11,}  {base_s:7.2f} s  JVM CPU {base_cpu:6.1f} s  "
        f"(published, lost, dups) {base_totals}"
    )
    audit_s, totals, jobs, audit_cpu = full_audit(spark, f"{root}/{n}")
    print(
        f"audit     N={n:>11,}  {audit_s:7.2f} s  JVM CPU {audit_cpu:6.1f} s  "
        f"lost {totals['lost']} (truth {truth['lost']}) dup_deliveries {totals['dup_deliveries']} "
        f"(truth {truth['dup_deliveries']}), {jobs} Spark jobs"
    )
    again_s, _, again_cpu = bare_query(spark, f"{root}/{n}")
    print(f"baseline  N={n:>11,}  {again_s:7.2f} s  JVM CPU {again_cpu:6.1f} s  (again)")
    small_s, small_totals, _, _ = full_audit(spark, f"{root}/{small_n}")
    print(
        f"audit     N={small_n:>11,}  {small_s:7.2f} s  lost {small_totals['lost']} "
        f"(truth {small_truth['lost']})"
    )
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    baseline = (base_s + again_s) / 2
    print(
        f"audit / baseline                 {audit_s / baseline:.2f}x  (target <= 1.5; "
        f"{audit_s / base_s:.2f}x / {audit_s / again_s:.2f}x against each baseline)"
    )
    base_cpu_mean = (base_cpu + again_cpu) / 2
    print(
        f"JVM CPU per message: audit {audit_cpu / n * 1e6:.2f} us, baseline "
        f"{base_cpu_mean / n * 1e6:.2f} us: {audit_cpu / base_cpu_mean:.2f}x (steadier under load)"
    )
    per_small, per_n = small_s / small_n, audit_s / n
    print(
        f"seconds/record  {small_n:,} {per_small:.3e}  {n:,} {per_n:.3e}  growth "
        f"{per_n / per_small:.2f}x (target <= 1.3)"
    )
    python_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"driver peak memory: JVM {jvm_peak_mb(spark):.0f} MB, Python {python_mb:.0f} MB")
    spark.stop()


if __name__ == "__main__":
    main()
