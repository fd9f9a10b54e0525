from django.core.management.base import BaseCommand, CommandError

from recovery.models import Activity
from recovery.retention import archive


class Command(BaseCommand):
    help = (
        "Bring messages retention archived (RETENTION_ARCHIVE_DIR, *.jsonl.gz) back into the "
        "store as they were: ids, times, status, properties, headers and body. Idempotent: a "
        "message whose fingerprint is in the store is skipped. Then run index_search --all."
    )

    def add_arguments(self, parser):
        parser.add_argument("files", nargs="+", metavar="FILE")
        parser.add_argument(
            "--touch",
            action="store_true",
            help="set each imported message's last change to now: otherwise one still past "
            "RETENTION_DAYS is deleted (and archived) again by the next hourly retention run",
        )

    def handle(self, *args, files, touch, **options):
        totals = {"imported": 0, "skipped": 0, "renumbered": 0, "origin_cleared": 0}
        for path in files:
            torn = {}
            try:
                counts = archive.import_rows(archive.read_archive(path, torn), touch=touch)
            except (OSError, ValueError, EOFError) as exc:
                # Each chunk is its own transaction: what was imported before stays, and a
                # re-run skips it.
                raise CommandError(f"{path}: {exc} (imported so far: {totals})") from exc
            for key, n in counts.items():
                totals[key] += n
            self.stdout.write(
                f"{path}: {counts['imported']} imported, {counts['skipped']} already in the "
                f"store, {counts['renumbered']} with a new id (theirs is taken), "
                f"{counts['origin_cleared']} whose origin is not in the store"
                + (
                    f"; {torn['members']} member(s) cut short by a crash skipped (their "
                    "messages were not deleted then: they are in the store or a later member)"
                    if torn
                    else ""
                )
            )
        Activity.record(
            None,
            "import_archive",
            detail={**totals, "files": [str(f) for f in files], "touch": touch},
            via="system",
        )
