import datetime

from django.core.management.base import BaseCommand, CommandError

from recovery.audit.run import run_audit
from recovery.models import AuditRun


class Command(BaseCommand):
    help = (
        "Audit one UTC day: export the store slice, run spark/audit.py on SPARK_MASTER, load the "
        "windows, totals and evidence. Re-running a day makes a new revision."
    )

    def add_arguments(self, parser):
        parser.add_argument("--date", required=True, help="YYYY-MM-DD (UTC)")
        parser.add_argument("--producer-logs", help="default: AUDIT_PRODUCER_LOGS")
        parser.add_argument("--consumer-logs", help="default: AUDIT_CONSUMER_LOGS")
        parser.add_argument("--grace-minutes", type=int, help="default: AUDIT_GRACE_MINUTES")
        parser.add_argument("--sla-ms", type=int, help="default: AUDIT_SLA_MS")
        parser.add_argument("--now", help="ISO time deciding FINAL vs PROVISIONAL (default: now)")
        parser.add_argument("--master", help="Spark master (default: SPARK_MASTER)")

    def handle(self, *args, **options):
        try:
            day = datetime.date.fromisoformat(options["date"])
            now = datetime.datetime.fromisoformat(options["now"]) if options["now"] else None
        except ValueError as exc:
            raise CommandError(f"bad date: {exc}") from exc
        if now is not None and now.tzinfo is None:
            now = now.replace(tzinfo=datetime.UTC)
        grace = options["grace_minutes"]
        run = run_audit(
            day,
            producer_logs=options["producer_logs"],
            consumer_logs=options["consumer_logs"],
            grace=datetime.timedelta(minutes=grace) if grace is not None else None,
            sla_ms=options["sla_ms"],
            now=now,
            master=options["master"],
        )
        if run.status != AuditRun.State.SUCCEEDED:
            raise CommandError(f"audit run {run.pk} failed: {run.error}")
        totals = run.totals
        self.stdout.write(
            f"audit run {run.pk} ({run.date} revision {run.revision}, {run.finality}): "
            + ", ".join(
                f"{k}={totals.get(k)}"
                for k in (
                    "distinct_published",
                    "publish_attempts",
                    "producer_retries",
                    "delivered_unique",
                    "dead_lettered",
                    "recovered",
                    "lost",
                    "pending",
                    "dup_msgs",
                    "dup_deliveries",
                    "orphan_consumptions",
                    "malformed_lines",
                    "input_gaps",
                )
            )
        )
