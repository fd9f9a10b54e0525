"""The audit's driver memory against the day's size, on a Spark standalone cluster.

On ``local[*]`` the driver JVM also runs the executors, so its memory is the whole job's. On a
cluster the executors hold the data; what the driver keeps (the logs' small facts, the outputs'
totals) should not grow with the day. This starts a standalone master and two workers (one core,
``--executor-memory`` each) from the pyspark distribution, then audits a generated day of each
size in a fresh driver process (``spark.driver.memory`` 1g) and prints the driver JVM's peak
resident memory (VmHWM) per size, and its growth against the size's. Prints, never asserts.

Usage: python bench/audit_driver.py [SIZES=1000000,4000000] [--executor-memory 2g]
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DRIVER_MEMORY = "1g"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_cluster(base, executor_memory):
    import pyspark

    spark_class = str(Path(pyspark.__file__).parent / "bin" / "spark-class")
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_NO_DAEMONIZE": "1"}
    port, ui = free_port(), free_port()
    master = ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1"]
    master += ["--port", str(port), "--webui-port", str(ui)]
    procs = [subprocess.Popen([spark_class, *master], env=env, cwd=base, stderr=subprocess.DEVNULL)]
    for n in (1, 2):
        work = Path(base) / f"worker{n}"
        work.mkdir()
        worker = ["org.apache.spark.deploy.worker.Worker", f"spark://127.0.0.1:{port}"]
        worker += ["--cores", "1", "--memory", executor_memory, "--work-dir", str(work)]
        worker += ["--host", "127.0.0.1", "--webui-port", str(free_port())]
        procs.append(
            subprocess.Popen([spark_class, *worker], env=env, cwd=base, stderr=subprocess.DEVNULL)
        )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{ui}/json/", timeout=2) as resp:
                if sum(w["state"] == "ALIVE" for w in json.load(resp)["workers"]) == 2:
                    return f"spark://127.0.0.1:{port}", procs
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit("the standalone cluster did not come up")


def child(directory, master, executor_memory):
    """One audit of ``directory`` in this (fresh) driver process; prints a JSON line."""
    from pyspark.sql import SparkSession

    from bench.audit import SHUFFLE_PARTITIONS, full_audit, jvm_peak_mb

    spark = (
        SparkSession.builder.master(master)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", DRIVER_MEMORY)
        .config("spark.executor.memory", executor_memory)
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", str(SHUFFLE_PARTITIONS))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    seconds, totals, _jobs, _cpu = full_audit(spark, directory)
    print(
        json.dumps({"seconds": seconds, "lost": totals["lost"], "driver_mb": jvm_peak_mb(spark)}),
        flush=True,
    )
    spark.stop()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sizes", nargs="?", default="1000000,4000000")
    parser.add_argument("--executor-memory", default="2g")
    parser.add_argument("--dir", default="/tmp/lazarus-bench-audit")
    parser.add_argument("--child", nargs=2, metavar=("DIRECTORY", "MASTER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child, args.executor_memory)
        return

    from bench.audit import generate

    sizes = [int(float(s)) for s in args.sizes.split(",")]
    for n in sizes:
        if not Path(f"{args.dir}/{n}/truth.json").exists():
            generate(f"{args.dir}/{n}", n)
    base = tempfile.mkdtemp(prefix="lazarus-spark-standalone-")
    master, procs = start_cluster(base, args.executor_memory)
    print(f"cluster {master}: 2 workers x 1 core x {args.executor_memory}; driver {DRIVER_MEMORY}")
    results = {}
    try:
        for n in sizes:
            out = subprocess.run(
                [sys.executable, __file__, "--child", f"{args.dir}/{n}", master]
                + ["--executor-memory", args.executor_memory],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            results[n] = json.loads(out.strip().splitlines()[-1])
            truth = json.loads(Path(f"{args.dir}/{n}/truth.json").read_text())
            r = results[n]
            print(
                f"N={n:>11,}  {r['seconds']:7.1f} s  driver JVM peak {r['driver_mb']:6.0f} MB  "
                f"lost {r['lost']} (truth {truth['lost']})",
                flush=True,
            )
    finally:
        for p in procs:
            p.terminate()
    small, large = sizes[0], sizes[-1]
    growth = results[large]["driver_mb"] / results[small]["driver_mb"]
    print(
        f"driver memory growth {growth:.2f}x for a day {large / small:.0f}x larger (1.00x = flat)"
    )


if __name__ == "__main__":
    main()
