"""Audit helpers: log files of a day, their lines, and a stored run with its windows."""

import datetime
import json

from recovery.models import AuditRun, AuditWindow

DAY = datetime.date(2026, 11, 20)


T0 = int(datetime.datetime(2026, 11, 20, 10, 0, tzinfo=datetime.UTC).timestamp() * 1000)


BINDINGS = [{"exchange": "shop", "routing_key": "order.#", "consumer_group": "billing"}]


def write_log(base, side, hour, name, lines):
    folder = base / side / f"dt={DAY.isoformat()}" / f"hour={hour:02d}"
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / f"{name}.jsonl").open("w") as fh:
        for line in lines:
            fh.write(line if isinstance(line, str) else json.dumps({"v": 1, **line}))
            fh.write("\n")


def produced(mid, attempt=1, outcome="ack", dt=0):
    return {
        "ts": T0 + dt,
        "producer": "shop-api",
        "message_id": mid,
        "exchange": "shop",
        "routing_key": "order.created",
        "attempt": attempt,
        "outcome": outcome,
        "confirm_ms": 3,
        "size": 100,
    }


def consumed(mid, dt=50, redelivered=False):
    return {
        "ts": T0 + dt,
        "consumer_group": "billing",
        "consumer": "billing-1",
        "queue": "billing.orders",
        "message_id": mid,
        "redelivered": redelivered,
        "outcome": "ack",
        "handle_ms": 2,
    }


HOUR = datetime.datetime(2026, 11, 20, 10, tzinfo=datetime.UTC)


def make_run():
    run = AuditRun.objects.create(
        date=HOUR.date(),
        status="succeeded",
        finality="PROVISIONAL",
        totals={"distinct_published": 100, "lost": 2, "dup_msgs": 3},
    )
    for hour, group, exchange, lost, p95, status in [
        (HOUR, "billing", "orders", 1, 40, "FINAL"),
        (HOUR, "billing", "refunds", 1, 90, "FINAL"),
        (HOUR, "shipping", "orders", 0, 30, "FINAL"),
        (HOUR + datetime.timedelta(hours=1), "billing", "orders", None, 55, "PROVISIONAL"),
    ]:
        AuditWindow.objects.create(
            run=run,
            window_start=hour,
            exchange=exchange,
            consumer_group=group,
            status=status,
            metrics={"lost": lost, "dup_msgs": 1, "latency_p95_ms": p95},
        )
    return run


def next_morning(day):
    """03:00 UTC the day after ``day``: every window of it FINAL (an audit's ``now``)."""
    return datetime.datetime.combine(day, datetime.time(), datetime.UTC) + datetime.timedelta(
        days=1, hours=3
    )


def evidence_ids(run):
    """{kind: {message_id}} of an AuditRun's evidence rows."""
    by_kind = {}
    for row in run.evidence.all():
        by_kind.setdefault(row.kind, set()).add(row.message_id)
    return by_kind
