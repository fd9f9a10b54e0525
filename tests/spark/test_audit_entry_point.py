"""The entry point on real files: JSON Lines and Parquet logs, a store export, a bindings file."""

import datetime
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark import audit
from spark.schema import STORE_EXPORT_SCHEMA
from tests.helpers.spark import at, consume, dead_letter, publish

pytestmark = pytest.mark.spark  # slow where a test needs the session (conftest.py)


def write_jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_it_audits_json_lines_and_parquet_logs_into_parquet_outputs(spark, tmp_path):
    producer = tmp_path / "logs" / "producer"
    consumer = tmp_path / "logs" / "consumer"
    write_jsonl(
        producer / "dt=2026-03-01" / "hour=10" / "p1-1.jsonl",
        [publish("lost-1", at(10)), publish("ok-1", at(10, 1))],
    )
    hour_11 = producer / "dt=2026-03-01" / "hour=11"
    hour_11.mkdir(parents=True)
    pq.write_table(
        pa.Table.from_pylist([publish("dl-1", at(11)), publish("dup-1", at(11, 2))]),
        hour_11 / "p1-1.parquet",
    )
    write_jsonl(
        consumer / "dt=2026-03-01" / "hour=11" / "c1-1.jsonl",
        [
            consume("dl-1", at(11, 0, 1), outcome="reject"),
            consume("dup-1", at(11, 2, 1)),
            consume("dup-1", at(11, 2, 2), redelivered=True),
        ],
    )
    hour_10 = consumer / "dt=2026-03-01" / "hour=10"
    hour_10.mkdir(parents=True)
    (hour_10 / "c1-1.jsonl").write_text(json.dumps(consume("ok-1", at(10, 1, 1))) + "\n{broken\n")
    store = tmp_path / "store.parquet"
    spark.createDataFrame(
        [dead_letter(41, "dl-1", at(11, 0, 2), reason="rejected")], STORE_EXPORT_SCHEMA
    ).write.parquet(str(store))
    bindings = tmp_path / "bindings.json"
    bindings.write_text(
        json.dumps([{"exchange": "orders", "routing_key": "order.#", "consumer_group": "billing"}])
    )
    out = tmp_path / "out"

    assert (
        audit.main(
            [
                "--date=2026-03-01",
                f"--producer-logs={producer}",
                f"--consumer-logs={consumer}",
                f"--store={store}",
                f"--bindings={bindings}",
                f"--out={out}",
                "--now=2026-03-04T00:00:00Z",
            ]
        )
        == 0
    )

    totals = json.loads((out / "totals.json").read_text())
    expected = {
        "status": "FINAL",
        "distinct_published": 4,
        "confirmed": 4,
        "delivered_unique": 2,
        "dead_lettered": 1,
        "dead_lettered_rejected": 1,
        "lost": 1,
        "dup_msgs": 1,
        "dup_broker_redelivery": 1,
        "malformed_lines": 1,
        "orphan_consumptions": 0,
    }
    assert {k: totals[k] for k in expected} == expected
    lost = spark.read.parquet(str(out / "lost")).collect()
    assert [(r.message_id, r.verdict) for r in lost] == [("lost-1", "lost")]
    duplicates = spark.read.parquet(str(out / "duplicates")).collect()
    assert [(r.message_id, r.cause) for r in duplicates] == [("dup-1", "broker_redelivery")]
    windows = spark.read.parquet(str(out / "windows"))
    assert windows.where("exchange IS NULL AND consumer_group IS NULL").count() == 24
    manifest = json.loads((out / "manifest.json").read_text())
    assert sorted((m["source"], m["path"].rsplit("/", 1)[-1]) for m in manifest) == [
        ("consumer", "c1-1.jsonl"),
        ("consumer", "c1-1.jsonl"),
        ("producer", "p1-1.jsonl"),
        ("producer", "p1-1.parquet"),
    ]
    assert all(m["bytes"] > 0 for m in manifest)


@pytest.mark.quick
def test_fractional_durations_are_valid_lines_whichever_columns_are_read(spark, tmp_path):
    """The client writes ``confirm_ms`` and ``handle_ms`` as any number (33.397): such a line is
    valid, read whole (as the span merge checkpoints it) or in part (as a summary reads it).
    Read as longs it was malformed only when the column was read."""
    from pyspark.sql import functions as F

    from spark.schema import (
        CONSUMER_LOG_SCHEMA,
        CONSUMER_REQUIRED,
        PRODUCER_LOG_SCHEMA,
        PRODUCER_REQUIRED,
        list_log_files,
        read_logs,
    )

    producer = tmp_path / "producer"
    consumer = tmp_path / "consumer"
    write_jsonl(
        producer / "dt=2026-03-01" / "hour=10" / "p.jsonl",
        [{**publish("m-1", at(10)), "confirm_ms": 33.397}],
    )
    write_jsonl(
        consumer / "dt=2026-03-01" / "hour=10" / "c.jsonl",
        [{**consume("m-1", at(10, 1)), "handle_ms": 2.25}],
    )
    for base, schema, required, duration in (
        (producer, PRODUCER_LOG_SCHEMA, PRODUCER_REQUIRED, "confirm_ms"),
        (consumer, CONSUMER_LOG_SCHEMA, CONSUMER_REQUIRED, "handle_ms"),
    ):
        files = list_log_files(spark, str(base), [datetime.datetime(2026, 3, 1, 10)])
        frame = read_logs(spark, files, str(base), schema, required)
        [whole] = frame.collect()
        assert whole["malformed"] is False and whole[duration] in (33, 2)
        assert frame.where(~F.col("malformed")).select("message_id").count() == 1
