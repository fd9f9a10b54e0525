"""Full Spark audit vs the bare loss/duplicate query of bench/baselines/audit_baseline.py.

Generates N publishes and ~N consumptions (0.1 % lost, 0.5 % delivered twice, as the baseline
does) in the log schema (docs/design.md "The log contract"), Parquet partitioned dt=/hour=, then
in ONE Spark session with the audit's shuffle partitions (settings.SPARK_SHUFFLE_PARTITIONS, 8)
for every contender, three rounds of: the baseline query at N, then the full audit
(run_audit + write_outputs) at N of three days over the same logs:
- ``bound``: every group bound (the everyday case);
- ``observed``: no binding names the consumer group (its expectations are observed: the audit
  takes its second pass);
- ``silent``: the bound group plus a group bound to one exchange that wrote no log (missing
  consumer logs, its messages unverified).
Each audit is divided by the baseline of its round (the machine is shared: a round's contenders
run back to back). Prints every figure as the median of the rounds beside each round's: seconds,
audit/baseline (target <= 1.2 for ``bound``), the Spark JVM's CPU per message (steadier than wall
time on a shared machine; target <= 1.3x), Spark jobs, the load average; then one audit at the
small N (seconds per record, growth) and the driver JVM's peak memory. Prints, never asserts.

Usage: python bench/audit.py [N=10000000] [--small 1000000] [--rounds 3]
       [--days bound,observed,silent] [--dir /tmp/lazarus-bench-audit]
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


def bench_session():
    """The local Spark every audit benchmark runs in: all cores, 4 GB, the product's shuffle
    partitions, no UI, errors only."""
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
    return spark


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


BINDINGS = {
    "bound": [
        {"exchange": "orders", "routing_key": "#", "consumer_group": "g", "queue": "q"},
        {"exchange": "payments", "routing_key": "#", "consumer_group": "g", "queue": "q"},
    ],
    "observed": [],
    "silent": [
        {"exchange": "orders", "routing_key": "#", "consumer_group": "g", "queue": "q"},
        {"exchange": "payments", "routing_key": "#", "consumer_group": "g", "queue": "q"},
        {"exchange": "orders", "routing_key": "#", "consumer_group": "silent", "queue": "sq"},
    ],
}
DAYS = tuple(BINDINGS)


def full_audit(spark, directory: str, day: str = "bound") -> tuple[float, dict, int, float]:
    from spark.audit import run_audit, write_outputs

    out = tempfile.mkdtemp(prefix="lazarus-audit-out-")
    group = f"audit-{directory}-{day}-{time.monotonic()}"
    spark.sparkContext.setJobGroup(group, "bench audit")
    cpu, t = jvm_cpu_seconds(spark), time.perf_counter()
    outputs = run_audit(
        spark,
        DAY,
        f"{directory}/producer",
        f"{directory}/consumer",
        None,
        BINDINGS[day],
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


def median(values) -> float:
    return float(np.median(values))


def figures(values, fmt: str) -> str:
    """'median (run 1, run 2, run 3)'."""
    return f"{fmt.format(median(values))} ({', '.join(fmt.format(v) for v in values)})"


def check(day: str, totals: dict, truth: dict) -> str:
    """What the day's totals show beside what they must."""
    lost = f"lost {totals['lost']} (truth {truth['lost']})"
    if day == "bound":
        return (
            f"{lost}, dup_deliveries {totals['dup_deliveries']} (truth {truth['dup_deliveries']})"
        )
    if day == "observed":
        return (
            f"{lost}, unbound_consumption {totals['unbound_consumption']}, "
            f"unclaimed {totals['unclaimed']}"
        )
    return (
        f"{lost}, unverified {totals['unverified']} (the silent group's pairs: every orders "
        f"message), missing_consumer_logs {totals['missing_consumer_logs']}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("n", nargs="?", type=lambda v: int(float(v)), default=10_000_000)
    parser.add_argument("--small", type=lambda v: int(float(v)), default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--days", default=",".join(DAYS), help="of bound,observed,silent")
    parser.add_argument("--dir", default="/tmp/lazarus-bench-audit")
    args = parser.parse_args()
    n, small_n, root = args.n, min(args.small, args.n), args.dir
    days = [d for d in args.days.split(",") if d]
    t = time.perf_counter()
    truth = generate(f"{root}/{n}", n)
    generate(f"{root}/{small_n}", small_n)
    print(f"generated {n:,} (+{small_n:,}) publishes in {time.perf_counter() - t:.1f} s")

    spark = bench_session()
    bare_query(spark, f"{root}/{small_n}")  # warm the JVM for every contender
    for day in days:
        full_audit(spark, f"{root}/{small_n}", day)

    base_s, base_cpu, loads = [], [], []
    audit_s, audit_cpu, jobs = ({d: [] for d in days} for _ in range(3))
    for r in range(1, args.rounds + 1):
        loads.append(os.getloadavg()[0])
        seconds, base_totals, cpu = bare_query(spark, f"{root}/{n}")
        base_s.append(seconds)
        base_cpu.append(cpu)
        print(
            f"round {r}  load {loads[-1]:4.1f}  baseline        {seconds:7.2f} s  "
            f"JVM CPU {cpu:6.1f} s  (published, lost, dups) {base_totals}",
            flush=True,
        )
        for day in days:
            seconds, totals, day_jobs, cpu = full_audit(spark, f"{root}/{n}", day)
            audit_s[day].append(seconds)
            audit_cpu[day].append(cpu)
            jobs[day].append(day_jobs)
            print(
                f"round {r}  audit {day:<9} {seconds:7.2f} s  JVM CPU {cpu:6.1f} s  "
                f"{day_jobs} Spark jobs  {check(day, totals, truth)}",
                flush=True,
            )
    loads.append(os.getloadavg()[0])
    print(
        f"\nN={n:,}, {args.rounds} rounds: median (each round). Load average (1 min) at each "
        f"round's start and the end: {', '.join(f'{v:.1f}' for v in loads)} on "
        f"{os.cpu_count()} CPUs"
    )
    per_message = [c / n * 1e6 for c in base_cpu]
    print(f"baseline              {figures(base_s, '{:.1f}')} s")
    print(f"  JVM CPU per message {figures(per_message, '{:.2f}')} us")
    for day in days:
        ratios = [a / b for a, b in zip(audit_s[day], base_s, strict=True)]
        cpu_ratios = [a / b for a, b in zip(audit_cpu[day], base_cpu, strict=True)]
        bound = day == "bound"
        print(f"audit {day:<9}       {figures(audit_s[day], '{:.1f}')} s")
        print(
            f"  audit / baseline    {figures(ratios, '{:.2f}x')}"
            f"{' (target <= 1.2)' if bound else ''}"
        )
        print(
            f"  JVM CPU per message {figures([c / n * 1e6 for c in audit_cpu[day]], '{:.2f}')} us"
            f": {figures(cpu_ratios, '{:.2f}x')} the baseline's"
            f"{' (target <= 1.3)' if bound else ''}"
        )
        print(f"  Spark jobs          {figures(jobs[day], '{:.0f}')}")
    small_s, _, _, _ = full_audit(spark, f"{root}/{small_n}", days[0])
    per_small, per_n = small_s / small_n, median(audit_s[days[0]]) / n
    print(
        f"seconds/record, audit {days[0]}: {small_n:,} {per_small:.3e} (one run), {n:,} "
        f"{per_n:.3e} (median): growth {per_n / per_small:.2f}x"
    )
    python_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"driver peak memory, local[*]: JVM {jvm_peak_mb(spark):.0f} MB, Python {python_mb:.0f} MB"
    )
    spark.stop()


if __name__ == "__main__":
    main()
