"""The audit's results into PostgreSQL: windows, totals and input gaps from the driver's small
outputs, and the evidence Parquet files COPYed one file (= one Spark partition) at a time."""

import datetime
import json
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
from django.db import transaction

from recovery import db
from recovery.db import database_conninfo
from recovery.errors import AuditError
from recovery.models import AuditInputGap, AuditWindow, metric_warnings
from recovery.models.audit import WINDOW_KEYS


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


EVIDENCE_SQL = """COPY recovery_auditevidence
    (run_id, kind, window_start, exchange, consumer_group, message_id, cause, count, store_id,
     producer_source, consumer_source)
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
        everything = _read(out, "expectations")
        # "differs: ...": a traced key whose bindings name other groups than the broker routed to
        differs = [e for e in everything if e["source"].startswith("differs: ")]
        expectations = [e for e in everything if e not in differs]
        if differs:
            run.warnings.append({"code": "trace_bindings_differ", "count": len(differs)})
        run.config = {
            **run.config,
            "trace_bindings_differ": [{k: _json_safe(v) for k, v in e.items()} for e in differs][
                :1000
            ],
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
        elif name in ("recoverable", "received_unknown"):
            kind, cause, count = name, row.get("published") or "", 1
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
            row.get("producer_source") or "",
            row.get("consumer_source") or "",
        )


def copy_evidence(run, out_dir, conninfo=None):
    """COPY each evidence Parquet file (one Spark partition each) into recovery_auditevidence."""
    with db.connect(conninfo or database_conninfo("lazarus-audit")) as conn:
        for name in (
            "lost",
            "duplicates",
            "orphans",
            "unclaimed",
            "recoverable",
            "received_unknown",
        ):
            folder = Path(out_dir) / name
            for part in sorted(folder.glob("*.parquet")) if folder.exists() else []:
                rows = pq.read_table(part).to_pylist()
                if not rows:
                    continue
                with conn.cursor() as cur, cur.copy(EVIDENCE_SQL) as copy:
                    for record in _evidence_rows(run.pk, name, rows):
                        copy.write_row(record)
            conn.commit()
