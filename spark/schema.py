"""The audit's input contracts: log schemas, the store export, the bindings snapshot, and readers.

Producer and consumer logs are the files the client library writes (docs/design.md "The log
contract", recovery/client/LOGS.md): JSON Lines or Parquet under ``BASE/dt=YYYY-MM-DD/hour=HH/``,
one file per process per hour, each record carrying a schema version ``v`` (1; a missing ``v`` is
read as 1).

The store export is a Parquet slice of the recovery store written by ``manage.py audit`` with
exactly the columns of ``STORE_EXPORT_SCHEMA``.
"""

import json
import re
from dataclasses import dataclass
from datetime import datetime, timedelta

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

LOG_SCHEMA_VERSIONS = (1,)
CORRUPT_RECORD = "_corrupt_record"

PRODUCER_LOG_SCHEMA = T.StructType(
    [
        T.StructField("v", T.LongType()),
        T.StructField("ts", T.LongType()),
        T.StructField("producer", T.StringType()),
        T.StructField("message_id", T.StringType()),
        T.StructField("exchange", T.StringType()),
        T.StructField("routing_key", T.StringType()),
        T.StructField("attempt", T.LongType()),
        T.StructField("outcome", T.StringType()),
        T.StructField("confirm_ms", T.LongType()),
        T.StructField("size", T.LongType()),
    ]
)

CONSUMER_LOG_SCHEMA = T.StructType(
    [
        T.StructField("v", T.LongType()),
        T.StructField("ts", T.LongType()),
        T.StructField("consumer_group", T.StringType()),
        T.StructField("consumer", T.StringType()),
        T.StructField("queue", T.StringType()),
        T.StructField("message_id", T.StringType()),
        T.StructField("redelivered", T.BooleanType()),
        T.StructField("outcome", T.StringType()),
        T.StructField("handle_ms", T.LongType()),
    ]
)

# Integers are read as 64-bit: narrower Parquet columns widen, wider ones would not narrow.
# Fields a record cannot be audited without; a record missing one counts as a malformed line.
PRODUCER_REQUIRED = ("ts", "producer", "message_id", "exchange", "outcome")
CONSUMER_REQUIRED = ("ts", "consumer_group", "consumer", "message_id", "outcome")

STORE_EXPORT_SCHEMA = T.StructType(
    [
        T.StructField("id", T.LongType(), nullable=False),
        T.StructField("kind", T.StringType(), nullable=False),
        T.StructField("reason", T.StringType()),
        T.StructField("status", T.StringType()),
        T.StructField("message_id", T.StringType()),
        T.StructField("source_exchange", T.StringType()),
        T.StructField("source_queue", T.StringType()),
        T.StructField("routing_key", T.StringType()),
        T.StructField("collected_at", T.TimestampType()),
        T.StructField("replay_count", T.LongType()),
        T.StructField("last_replayed_at", T.TimestampType()),
    ]
)

# The parsed log frames: the schema columns plus the hour of the file each line came from.
LOG_PROVENANCE = T.StructType(
    [
        T.StructField("file_hour_ms", T.LongType()),
        T.StructField("malformed", T.BooleanType()),
    ]
)

HOUR_MS = 3_600_000


def topic_pattern_regex(pattern: str) -> str:
    """AMQP topic binding key -> anchored Java regex (``*`` one word, ``#`` zero or more words)."""
    words = pattern.split(".")
    if words == ["#"]:
        return "^.*$"
    out = ""
    for i, word in enumerate(words):
        if word == "#":
            out += r"(?:.*\.)?" if i == 0 else r"(?:\..*)?"
            continue
        separator = "" if i == 0 or words[i - 1] == "#" and i == 1 else r"\."
        out += separator + ("[^.]+" if word == "*" else re.escape(word))
    return f"^{out}$"


def load_bindings(path: str) -> list[dict]:
    """The bindings snapshot: which consumer group expects which exchange/routing-key pattern.

    Each entry is ``{"exchange", "routing_key", "consumer_group"}`` plus an optional ``"queue"``
    (maps the store's ``source_queue`` to the group). Fanout bindings use ``"#"``.
    """
    with open(path, encoding="utf-8") as fh:
        bindings = json.load(fh)
    if not isinstance(bindings, list):
        raise ValueError(f"{path}: the bindings snapshot must be a JSON list")
    for entry in bindings:
        missing = {"exchange", "routing_key", "consumer_group"} - set(entry)
        if missing:
            raise ValueError(f"{path}: binding {entry!r} lacks {sorted(missing)}")
    return bindings


@dataclass(frozen=True)
class LogFile:
    path: str
    size: int


def hour_partitions(first_hour: datetime, hours: int) -> list[datetime]:
    return [first_hour + timedelta(hours=h) for h in range(hours)]


def list_log_files(spark: SparkSession, base: str, hours: list[datetime]) -> list[LogFile]:
    """The files under ``base`` for the given UTC hours, through Hadoop's FileSystem.

    Going through Hadoop keeps every path Spark can read (local, ``hdfs://``, ``s3a://``) usable,
    and gives the sizes for the run's input manifest.
    """
    jvm = spark.sparkContext._jvm
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    root = base.rstrip("/")
    days = sorted({h.strftime("%Y-%m-%d") for h in hours})
    wanted = {(h.strftime("%Y-%m-%d"), h.strftime("%H")) for h in hours}
    glob = jvm.org.apache.hadoop.fs.Path(f"{root}/dt={{{','.join(days)}}}/hour=*/*")
    statuses = glob.getFileSystem(conf).globStatus(glob) or []
    files = []
    for status in statuses:
        path = status.getPath()
        name = path.getName()
        if not status.isFile() or name.startswith((".", "_")):
            continue
        hour_dir, day_dir = path.getParent().getName(), path.getParent().getParent().getName()
        if (day_dir.removeprefix("dt="), hour_dir.removeprefix("hour=")) in wanted:
            files.append(LogFile(path.toString(), status.getLen()))
    return sorted(files, key=lambda f: f.path)


def read_logs(
    spark: SparkSession, files: list[LogFile], base: str, schema: T.StructType, required
) -> DataFrame:
    """Parse log files with an explicit schema; malformed lines are flagged, never fatal.

    JSON Lines are read PERMISSIVE with a corrupt-record column; Parquet by the same schema.
    Output: the schema's columns + ``file_hour_ms`` (the file's ``dt``/``hour`` partition as
    epoch ms) and ``malformed`` (unparseable, missing a required field, or of an unknown schema
    version). ``malformed`` is written as null checks and comparisons only, so a filter on it
    reaches the Parquet reader, which skips the row groups whose statistics rule it out.
    (The files read are listed in the run's manifest, not on every line: a per-line path
    would make the reader materialise Spark's ``_metadata`` struct for every row.)
    """
    out_columns = [*schema.fieldNames(), *LOG_PROVENANCE.fieldNames()]
    if not files:
        return spark.createDataFrame([], T.StructType([*schema.fields, *LOG_PROVENANCE.fields]))
    parquet = [f.path for f in files if f.path.endswith(".parquet")]
    json_lines = [f.path for f in files if not f.path.endswith(".parquet")]
    # ``dt`` typed as a date: the reader parses it once per directory, not once per line.
    partition_fields = [T.StructField("dt", T.DateType()), T.StructField("hour", T.IntegerType())]
    frames = []
    if json_lines:
        json_schema = T.StructType(
            [
                *(_as_json_field(f) for f in schema.fields),
                T.StructField(CORRUPT_RECORD, T.StringType()),
                *partition_fields,
            ]
        )
        frames.append(
            spark.read.schema(json_schema)
            .option("mode", "PERMISSIVE")
            .option("columnNameOfCorruptRecord", CORRUPT_RECORD)
            .option("basePath", base)
            .json(json_lines)
        )
    if parquet:
        frames.append(
            spark.read.schema(T.StructType([*schema.fields, *partition_fields]))
            .option("basePath", base)
            .parquet(*parquet)
            .withColumn(CORRUPT_RECORD, F.lit(None).cast(T.StringType()))
        )
    logs = frames[0] if len(frames) == 1 else frames[0].unionByName(frames[1])
    missing_required = F.lit(False)
    for name in required:
        missing_required = missing_required | F.col(name).isNull()
    # A missing ``v`` is version 1; any other value must be a known version.
    unknown_version = F.col("v").isNotNull()
    for version in LOG_SCHEMA_VERSIONS:
        unknown_version = unknown_version & (F.col("v") != version)
    return logs.select(
        # The JSON side's fractional durations back to the schema's types (a no-op elsewhere).
        *(F.col(f.name).cast(f.dataType).alias(f.name) for f in schema.fields),
        (F.unix_date("dt").cast("long") * 86_400_000 + F.col("hour") * HOUR_MS).alias(
            "file_hour_ms"
        ),
        (F.col(CORRUPT_RECORD).isNotNull() | missing_required | unknown_version).alias("malformed"),
    ).select(*out_columns)


# Durations the log contract gives as any number (the client writes ``confirm_ms`` 33.397):
# read from JSON as doubles, then cast to the schema's long. Read as longs, a fractional value
# makes its whole line malformed, but only when the column is read: the JSON reader parses the
# columns a query uses, so the same line was valid for one query and malformed for another.
FRACTIONAL_JSON_FIELDS = ("confirm_ms", "handle_ms")


def _as_json_field(field: T.StructField) -> T.StructField:
    if field.name in FRACTIONAL_JSON_FIELDS:
        return T.StructField(field.name, T.DoubleType(), field.nullable)
    return field


def epoch_ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)
