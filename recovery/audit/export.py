"""The audit's store slice: the messages of a day (and its grace) as one Parquet file, by psycopg
COPY in bounded batches (no JDBC jar in Spark)."""

import datetime

import pyarrow as pa
import pyarrow.parquet as pq

from recovery import db
from recovery.db import database_conninfo

STORE_EXPORT_COLUMNS = pa.schema(
    [
        ("id", pa.int64()),
        ("kind", pa.string()),
        ("reason", pa.string()),
        ("status", pa.string()),
        ("message_id", pa.string()),
        ("source_exchange", pa.string()),
        ("source_queue", pa.string()),
        ("routing_key", pa.string()),
        ("collected_at", pa.timestamp("us", tz="UTC")),
        ("replay_count", pa.int32()),
        ("last_replayed_at", pa.timestamp("us", tz="UTC")),
    ]
)
EXPORT_TYPES = ["int8", *["text"] * 7, "timestamptz", "int4", "timestamptz"]
EXPORT_BATCH_ROWS = 50_000  # bounded memory however large the slice


def day_bounds(day, grace):
    start = datetime.datetime(day.year, day.month, day.day, tzinfo=datetime.UTC)
    return start, start + datetime.timedelta(days=1) + grace


def export_store(day, grace, path, conninfo=None):
    """Write the store rows collected from (day start - 1 day) to (day end + grace) as Parquet.

    The look-back catches messages of the day's first hour that died just before midnight in a
    producer's clock. Returns the number of rows.
    """
    start, end = day_bounds(day, grace)
    start -= datetime.timedelta(days=1)
    query = """
        COPY (SELECT id, kind, reason, status, NULLIF(message_id, ''), source_exchange,
                     source_queue, routing_keys->>0, collected_at, replay_count, last_replayed_at
              FROM recovery_message WHERE collected_at >= %s AND collected_at < %s)
        TO STDOUT
    """
    rows = 0
    with (
        db.connect(conninfo or database_conninfo("lazarus-audit")) as conn,
        conn.cursor() as cur,
        pq.ParquetWriter(path, STORE_EXPORT_COLUMNS) as writer,
        cur.copy(query, (start, end)) as copy,
    ):
        copy.set_types(EXPORT_TYPES)
        batch = []
        for row in copy.rows():
            batch.append(row)
            if len(batch) >= EXPORT_BATCH_ROWS:
                writer.write_table(_table(batch))
                rows += len(batch)
                batch = []
        if batch or rows == 0:
            writer.write_table(_table(batch))
            rows += len(batch)
    return rows


def _table(rows):
    columns = list(zip(*rows, strict=True)) if rows else [[] for _ in STORE_EXPORT_COLUMNS]
    return pa.Table.from_arrays(
        [
            pa.array(col, type=field.type)
            for col, field in zip(columns, STORE_EXPORT_COLUMNS, strict=True)
        ],
        schema=STORE_EXPORT_COLUMNS,
    )
