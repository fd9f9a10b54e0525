"""Loss/duplicate audit over producer+consumer logs: Spark (local[*]) vs DuckDB, same data, same answer.

gen N: writes N publish rows and ~N consume rows (with injected loss and duplicates) as Parquet.
run: computes per-hour published, lost, duplicate deliveries with each engine; prints seconds and counts.
Usage: python audit_baseline.py DIR N
"""

import os
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

d, N = sys.argv[1], int(sys.argv[2])
rng = np.random.default_rng(7)
os.makedirs(d, exist_ok=True)
if not os.path.exists(f"{d}/producer"):
    ids = np.char.add("m-", np.arange(N).astype(str))
    t0 = 1_790_000_000_000
    pts = t0 + np.sort(rng.integers(0, 24 * 3600 * 1000, N))
    pq.write_to_dataset(
        pa.table(
            {
                "message_id": ids,
                "exchange": np.where(rng.random(N) < 0.5, "orders", "payments"),
                "routing_key": np.full(N, "rk"),
                "ts": pts,
                "outcome": np.full(N, "ack"),
            }
        ),
        f"{d}/producer",
    )
    keep = rng.random(N) >= 0.001  # 0.1 % lost
    dup = rng.random(N) < 0.005  # 0.5 % delivered twice
    cid = np.concatenate([ids[keep], ids[keep & dup]])
    cts = np.concatenate([pts[keep], pts[keep & dup]]) + rng.integers(1, 5000, cid.size)
    pq.write_to_dataset(
        pa.table(
            {
                "message_id": cid,
                "queue": np.full(cid.size, "q"),
                "consumer_group": np.full(cid.size, "g"),
                "ts": cts,
            }
        ),
        f"{d}/consumer",
    )
    print("expected lost", int((~keep).sum()), "dups", int((keep & dup).sum()))

SQL = """
WITH p AS (SELECT message_id, min(ts) ts FROM producer GROUP BY message_id),
     c AS (SELECT message_id, count(*) n FROM consumer GROUP BY message_id)
SELECT CAST(floor(p.ts / 3600000) AS BIGINT) AS hr, count(*) published,
       sum(CASE WHEN c.n IS NULL THEN 1 ELSE 0 END) lost,
       sum(CASE WHEN c.n > 1 THEN c.n - 1 ELSE 0 END) dup_deliveries
FROM p LEFT JOIN c ON p.message_id = c.message_id GROUP BY 1 ORDER BY 1
"""


def totals(rows):
    return sum(r[1] for r in rows), sum(r[2] for r in rows), sum(r[3] for r in rows)


import duckdb

t = time.perf_counter()
con = duckdb.connect()
con.execute(f"CREATE VIEW producer AS SELECT * FROM read_parquet('{d}/producer/*.parquet')")
con.execute(f"CREATE VIEW consumer AS SELECT * FROM read_parquet('{d}/consumer/*.parquet')")
r = con.execute(SQL).fetchall()
print(f"duckdb  {time.perf_counter() - t:7.2f} s  totals {totals(r)}")

t = time.perf_counter()
from pyspark.sql import SparkSession

spark = (
    SparkSession.builder.master("local[*]")
    .config("spark.ui.enabled", "false")
    .config("spark.driver.memory", "4g")
    .getOrCreate()
)
t1 = time.perf_counter()
spark.read.parquet(f"{d}/producer").createOrReplaceTempView("producer")
spark.read.parquet(f"{d}/consumer").createOrReplaceTempView("consumer")
r = [tuple(x) for x in spark.sql(SQL).collect()]
print(
    f"spark   {time.perf_counter() - t:7.2f} s  (session start {t1 - t:.2f} s) totals {totals(r)}"
)
