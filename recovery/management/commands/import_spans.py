import sys
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from recovery.telemetry import otlp, spans, store


class Command(BaseCommand):
    help = (
        "Read files the OpenTelemetry Collector's file exporter wrote (OTLP JSON lines, or its "
        "length-prefixed proto/zstd records; a rotated .gz too) and keep their messaging spans "
        "under AUDIT_SPANS, as the POST /v1/traces intake does. With --compact, merge each "
        "closed hour's span files into one instead (the intake writes one file per request)."
    )

    def add_arguments(self, parser):
        parser.add_argument("paths", nargs="*", help="files the Collector's file exporter wrote")
        parser.add_argument(
            "--compact",
            action="store_true",
            help="merge the span files of every hour that ended over an hour ago (local "
            "AUDIT_SPANS only); with --day, that day's hours only",
        )
        parser.add_argument("--day", help="with --compact: YYYY-MM-DD")
        parser.add_argument(
            "--max-record-bytes",
            type=int,
            default=None,
            help="a record (a line) larger than this is reported and skipped "
            "(default OTLP_MAX_INFLATED_BYTES)",
        )

    def handle(self, *args, paths, compact, day, max_record_bytes, **options):
        base = settings.AUDIT_SPANS
        if compact:
            return self.compact(base, day)
        if not paths:
            raise CommandError("name the files to import, or --compact")
        limit = max_record_bytes or settings.OTLP_MAX_INFLATED_BYTES
        totals = {"kept": 0, "skipped": 0, "rejected": 0, "bad_records": 0}
        for path in paths:
            try:
                self.import_file(base, path, limit, totals)
            except OSError as error:
                raise CommandError(f"{path}: {error}") from error
        self.stdout.write(
            f"{totals['kept']} messaging spans kept under {base}, {totals['skipped']} other spans "
            f"skipped, {totals['rejected']} rejected, {totals['bad_records']} unreadable records"
        )
        if totals["bad_records"] or totals["rejected"]:
            sys.exit(1)  # the good ones are kept; the exit says not all were

    def import_file(self, base, path, limit, totals):
        for number, request in otlp.read_file(path, limit):
            if isinstance(request, otlp.Malformed):
                totals["bad_records"] += 1
                self.stderr.write(f"{path}: record {number}: {request}")
                continue
            flattened = spans.flatten(request)
            store.write(base, flattened)
            totals["kept"] += flattened.kept
            totals["skipped"] += flattened.skipped
            totals["rejected"] += flattened.rejected
            if flattened.rejected:
                self.stderr.write(f"{path}: record {number}: {flattened.error_message}")

    def compact(self, base, day):
        if store.remote(base) is not None:
            raise CommandError(f"--compact is for a local AUDIT_SPANS, not {base}")
        before = datetime.now(UTC) - timedelta(hours=1)
        merged = 0
        for directory in store.compactable_hours(base, day=day, before=before):
            files, rows = store.compact_hour(directory)
            if files:
                merged += 1
                self.stdout.write(f"{directory}: {files} files, {rows} spans, now one file")
        self.stdout.write(f"{merged} hours compacted")
