"""The Django side of the nightly audit: export the store slice, run the Spark job, load results.

export_store()        psycopg COPY of the store slice -> one Parquet file (no JDBC jar)
bindings_for_day()    which consumer groups expect which exchange/routing key, and when
                      (recovery/audit/bindings.py: the bindings history)
run_spark()           spark-submit spark/audit.py with SPARK_MASTER, in a child process, so the
                      JVM never lives inside a web or Celery process
load_results()        windows/totals/gaps from the driver's small outputs; evidence Parquet
                      files COPYed into PostgreSQL one file (= one Spark partition) at a time
run_audit()           all of it as one AuditRun; re-running a day makes a new revision
"""

import datetime
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from django.conf import settings
from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from recovery import db
from recovery.audit.bindings import bindings_for_day
from recovery.db import database_conninfo
from recovery.errors import AuditError
from recovery.models import AuditInputGap, AuditRun, AuditWindow, metric_warnings

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]
SPARK_ENTRY = REPO / "spark" / "audit.py"

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


def spark_submit():
    found = shutil.which("spark-submit", path=str(Path(sys.executable).parent))
    if found:
        return found
    import pyspark

    return str(Path(pyspark.__file__).parent / "bin" / "spark-submit")


def run_spark(
    day,
    producer_logs,
    consumer_logs,
    store_path,
    bindings_path,
    out_dir,
    grace,
    sla_ms,
    now=None,
    master=None,
):
    command = [
        spark_submit(),
        "--master",
        master or settings.SPARK_MASTER,
        "--conf",
        "spark.ui.enabled=false",
        "--conf",
        "spark.sql.session.timeZone=UTC",
        "--conf",
        f"spark.sql.shuffle.partitions={settings.SPARK_SHUFFLE_PARTITIONS}",
        "--driver-memory",
        settings.SPARK_DRIVER_MEMORY,
        str(SPARK_ENTRY),
        "--date",
        day.isoformat(),
        "--producer-logs",
        producer_logs,
        "--consumer-logs",
        consumer_logs,
        "--store",
        store_path,
        "--bindings",
        bindings_path,
        "--out",
        out_dir,
        "--grace-minutes",
        str(int(grace.total_seconds() // 60)),
        "--sla-ms",
        str(sla_ms),
    ]
    if now is not None:
        command += ["--now", now.isoformat()]
    if settings.SPARK_EXECUTOR_MEMORY:
        command[1:1] = ["--executor-memory", settings.SPARK_EXECUTOR_MEMORY]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYTHONPATH": str(REPO)}
    try:
        proc = subprocess.run(
            command,
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=settings.AUDIT_TIMEOUT_SECONDS,
        )
    except subprocess.TimeoutExpired as exc:
        raise AuditError(f"spark-submit did not finish in {exc.timeout} s") from exc
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-25:])
        raise AuditError(f"spark-submit failed ({proc.returncode}):\n{tail}")
    return proc


def check_outputs(out_dir):
    """Every row the Spark job says it wrote (rows.json, counted by the job) is readable here.

    On a cluster whose executors run on other machines, an output directory that is not on
    storage they and this machine share gets its part files scattered over their local disks:
    this side would read fewer rows (or none) and report a quiet, wrong result. It fails the run
    instead, naming AUDIT_WORK_DIR."""
    summary = Path(out_dir) / "rows.json"
    if not summary.exists():
        raise AuditError(f"the Spark job wrote no {summary.name}: its outputs cannot be checked")
    short = []
    for name, expected in json.loads(summary.read_text()).items():
        folder = Path(out_dir) / name
        parts = sorted(folder.glob("*.parquet")) if folder.exists() else []
        found = sum(pq.read_metadata(part).num_rows for part in parts)
        if found != expected:
            short.append(f"{name}: {found} of {expected} rows")
    if short:
        raise AuditError(
            "the Spark job's outputs are not all readable here ("
            + "; ".join(short)
            + "): on a cluster, AUDIT_WORK_DIR must be storage the executors and this machine "
            "share (NFS, or a mount of the same object store)"
        )


def _read(out_dir, name):
    path = Path(out_dir) / name
    if not path.exists():
        return []
    return pq.read_table(path).to_pylist()


def _as_utc(value):
    if value is None:
        return None
    return value if value.tzinfo else value.replace(tzinfo=datetime.UTC)


def _json_safe(value):
    if isinstance(value, datetime.datetime):
        return value.isoformat()
    if isinstance(value, float) and value != value:  # NaN
        return None
    return value


# The key columns of the job's windows output: spark.metrics.WINDOW_KEYS, which this side may
# not import (spark/ and recovery/ are separate layers); a test in tests/spark holds them equal.
WINDOW_KEYS = ("window_start", "window_end", "status", "exchange", "consumer_group")

EVIDENCE_SQL = """COPY recovery_auditevidence
    (run_id, kind, window_start, exchange, consumer_group, message_id, cause, count, store_id)
    FROM STDIN"""


def load_results(run, out_dir, conninfo=None):
    """Load the Spark outputs of ``out_dir`` into ``run`` (windows, totals, gaps, evidence)."""
    out = Path(out_dir)
    totals = json.loads((out / "totals.json").read_text())
    manifest = json.loads((out / "manifest.json").read_text())
    windows = []
    for row in _read(out, "windows"):
        metrics = {k: _json_safe(v) for k, v in row.items() if k not in WINDOW_KEYS}
        windows.append(
            AuditWindow(
                run=run,
                window_start=_as_utc(row["window_start"]),
                exchange=row.get("exchange") or "",
                consumer_group=row.get("consumer_group") or "",
                status=row["status"],
                in_gap=bool(metrics.get("input_gaps")),
                metrics=metrics,
            )
        )
    gaps = [
        AuditInputGap(
            run=run,
            hour=_as_utc(row["window_start"]),
            side=row.get("source") or "",
            process=row.get("process") or "",
            consumer_group=row.get("consumer_group") or "",
        )
        for row in _read(out, "input_gaps")
    ]
    with transaction.atomic():
        AuditWindow.objects.bulk_create(windows, batch_size=1000)
        AuditInputGap.objects.bulk_create(gaps, batch_size=1000)
        run.totals = {k: _json_safe(v) for k, v in totals.items()}
        # Where the expectations came from (set before the job ran), then what it could not
        # decide; the observed expectations are kept with the settings the run used.
        run.warnings = [*run.warnings, *metric_warnings(run.totals)]
        expectations = _read(out, "expectations")
        run.config = {
            **run.config,
            "expected_by": dict(Counter(e["source"] for e in expectations)),
            "observed": [
                {k: _json_safe(v) for k, v in e.items() if k != "source"}
                for e in expectations
                if e["source"] == "observed"
            ][:1000],
        }
        run.finality = totals.get("status") or (
            "FINAL" if windows and all(w.status == "FINAL" for w in windows) else "PROVISIONAL"
        )
        run.manifest = {
            "files": manifest,
            "bytes": sum(f.get("bytes") or 0 for f in manifest),
            "rows": {
                k: totals.get(k)
                for k in ("producer_lines", "consumer_lines", "store_rows", "malformed_lines")
                if k in totals
            },
        }
        run.save(update_fields=["totals", "warnings", "config", "finality", "manifest"])
    copy_evidence(run, out, conninfo)


def _evidence_rows(run_id, name, rows):
    for row in rows:
        if name == "lost":
            kind, cause, count = row.get("verdict") or "lost", row.get("expected_by") or "", 1
        elif name == "unclaimed":
            kind, cause, count = "unclaimed", (row.get("routing_key") or "")[:64], 1
        elif name == "duplicates":
            kind, cause, count = "duplicate", row.get("cause") or "", row.get("extra_deliveries")
        else:
            kind, cause, count = "orphan", row.get("consumer") or "", 1
        yield (
            run_id,
            kind,
            _as_utc(row.get("window_start")),
            row.get("exchange") or "",
            row.get("consumer_group") or "",
            row.get("message_id") or "",
            cause,
            count or 1,
            row.get("store_id"),
        )


def copy_evidence(run, out_dir, conninfo=None):
    """COPY each evidence Parquet file (one Spark partition each) into recovery_auditevidence."""
    with db.connect(conninfo or database_conninfo("lazarus-audit")) as conn:
        for name in ("lost", "duplicates", "orphans", "unclaimed"):
            folder = Path(out_dir) / name
            for part in sorted(folder.glob("*.parquet")) if folder.exists() else []:
                rows = pq.read_table(part).to_pylist()
                if not rows:
                    continue
                with conn.cursor() as cur, cur.copy(EVIDENCE_SQL) as copy:
                    for record in _evidence_rows(run.pk, name, rows):
                        copy.write_row(record)
            conn.commit()


def new_run(day, user, config):
    """The day's next AuditRun (revision + 1), created with the day's runs locked so two audits
    of one day never take the same revision."""
    with transaction.atomic():
        list(AuditRun.objects.select_for_update().filter(date=day))
        latest = AuditRun.objects.filter(date=day).aggregate(m=Max("revision"))["m"]
        return AuditRun.objects.create(
            date=day,
            revision=(latest or 0) + 1,
            created_by=user,
            code_version=code_version(),
            config=config,
        )


def run_audit(
    day,
    producer_logs=None,
    consumer_logs=None,
    grace=None,
    sla_ms=None,
    now=None,
    master=None,
    user=None,
    bindings=None,
):
    """Audit one UTC day end to end; returns the AuditRun (``failed`` with the error on failure)."""
    grace = grace or datetime.timedelta(minutes=settings.AUDIT_GRACE_MINUTES)
    sla_ms = sla_ms or settings.AUDIT_SLA_MS
    producer_logs = producer_logs or settings.AUDIT_PRODUCER_LOGS
    consumer_logs = consumer_logs or settings.AUDIT_CONSUMER_LOGS
    run = new_run(
        day,
        user,
        {
            "producer_logs": producer_logs,
            "consumer_logs": consumer_logs,
            "grace_minutes": grace.total_seconds() / 60,
            "sla_ms": sla_ms,
            "spark_master": master or settings.SPARK_MASTER,
            "now": now.isoformat() if now else None,
        },
    )
    workdir = Path(
        tempfile.mkdtemp(prefix=f"lazarus-audit-{day}-", dir=settings.AUDIT_WORK_DIR or None)
    )
    try:
        store_path = workdir / "store.parquet"
        store_rows = export_store(day, grace, store_path)
        if bindings is None:
            bindings, run.warnings = bindings_for_day(day, grace)
        bindings_path = workdir / "bindings.json"
        bindings_path.write_text(json.dumps(bindings))
        run.config = {**run.config, "bindings": bindings, "store_rows": store_rows}
        run.save(update_fields=["config", "warnings"])
        out_dir = workdir / "out"
        run_spark(
            day,
            producer_logs,
            consumer_logs,
            str(store_path),
            str(bindings_path),
            str(out_dir),
            grace,
            sla_ms,
            now=now,
            master=master,
        )
        check_outputs(out_dir)
        load_results(run, out_dir)
        run.status = AuditRun.State.SUCCEEDED
    except Exception as exc:
        log.exception("audit of %s failed", day)
        run.status = AuditRun.State.FAILED
        run.error = f"{type(exc).__name__}: {exc}"[:10000]
    finally:
        run.finished_at = timezone.now()
        run.save(update_fields=["status", "error", "finished_at"])
        shutil.rmtree(workdir, ignore_errors=True)
    return run


def code_version():
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
