from django.core.management.base import BaseCommand, CommandError

from recovery.search import index as search_index


class Command(BaseCommand):
    help = (
        "Copy messages' search documents into the trigram-indexed search table now (Celery beat "
        "does it every SEARCH_INDEX_SECONDS). --all also checks every older message, as the "
        "hourly sweep does; use it after a restore or a bulk load."
    )

    def add_arguments(self, parser):
        parser.add_argument("--all", action="store_true", help="sweep the whole store")

    def handle(self, *args, all, **options):
        total = search_index.index_new(budget_seconds=None)
        if total is None:
            raise CommandError("another indexer run holds the lock; try again shortly")
        if all:
            total += search_index.sweep() or 0
        self.stdout.write(
            f"{total} messages indexed; {search_index.unindexed_count()} above the mark"
        )
