"""The Django side of the nightly audit: export the store slice, run the Spark job, load results.

export_store()        psycopg COPY of the store slice -> one Parquet file (recovery/audit/export.py)
bindings_for_day()    which consumer groups expect which exchange/routing key, and when
                      (recovery/audit/bindings.py: the bindings history)
run_spark()           spark-submit spark/audit.py with SPARK_MASTER, in a child process, so the
                      JVM never lives inside a web or Celery process
load_results()        windows/totals/gaps from the driver's small outputs; evidence Parquet
                      files COPYed into PostgreSQL one file (= one Spark partition) at a time
                      (recovery/audit/results.py)
run_audit()           all of it as one AuditRun; re-running a day makes a new revision
"""

import datetime
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from recovery.audit.bindings import bindings_for_day
from recovery.audit.export import export_store
from recovery.audit.results import check_outputs, load_results
from recovery.audit.trace import trace_input
from recovery.errors import AuditError
from recovery.models import AuditRun

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]
SPARK_ENTRY = REPO / "spark" / "audit.py"


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
    spans=None,
    trace_path=None,
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
    if spans:
        command += ["--spans", spans]
    if trace_path:
        command += ["--trace", trace_path]
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
        raise AuditError(
            f"spark-submit failed ({proc.returncode}):\n{failure_text(proc.stdout, proc.stderr)}"
        )
    return proc


SPARK_LOG_LINE = re.compile(r"^\d{2}/\d{2}/\d{2} \d{2}:\d{2}:\d{2} ")


def failure_text(stdout: str, stderr: str, tail_lines: int = 25, max_traceback: int = 60) -> str:
    """What a failed spark-submit says: the job's last Python traceback, then the last lines of
    Spark's log. spark-submit hands the Python driver's stderr to its own stdout, so the
    traceback is there; the log's tail alone is mostly Spark shutting down."""
    tail = stderr.strip().splitlines()[-tail_lines:]
    lines = stdout.splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent")]
    if not starts:
        return "\n".join(tail)
    block = []
    for line in lines[starts[-1] :]:
        if SPARK_LOG_LINE.match(line) or len(block) == max_traceback:
            break
        block.append(line)
    return "\n".join([*block, "--- the end of spark-submit's log:", *tail])


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
    spans=None,
):
    """Audit one UTC day end to end; returns the AuditRun (``failed`` with the error on failure)."""
    grace = grace or datetime.timedelta(minutes=settings.AUDIT_GRACE_MINUTES)
    sla_ms = sla_ms or settings.AUDIT_SLA_MS
    producer_logs = producer_logs or settings.AUDIT_PRODUCER_LOGS
    consumer_logs = consumer_logs or settings.AUDIT_CONSUMER_LOGS
    # OpenTelemetry span rows, read beside the logs (spark/spans.py; docs/audit.md "Traces").
    spans = spans or settings.AUDIT_SPANS
    run = new_run(
        day,
        user,
        {
            "producer_logs": producer_logs,
            "consumer_logs": consumer_logs,
            "spans": spans,
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
        # The broker's trace, where a tap wrote any (recovery/audit/trace.py).
        trace, trace_warnings = trace_input(day, grace)
        trace_path = None
        if trace:
            trace_path = workdir / "trace.json"
            trace_path.write_text(json.dumps(trace))
            run.warnings = [*run.warnings, *trace_warnings]
        bindings_path = workdir / "bindings.json"
        bindings_path.write_text(json.dumps(bindings))
        run.config = {
            **run.config,
            "bindings": bindings,
            "store_rows": store_rows,
            "trace": trace
            and {
                "path": trace["path"],
                "gaps": trace["gaps"][:1000],
                "queued": trace["queued"][:1000],
            },
        }
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
            spans=spans,
            trace_path=trace_path and str(trace_path),
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
