from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from recovery.broker.topology import wire
from recovery.errors import ManagementError


class Command(BaseCommand):
    help = (
        "Declare the recovery topology (DLX, dead-letter, unrouted, returns and quarantine "
        "queues) and, with --queues/--exchanges, make matching application queues dead-letter "
        "to it and matching exchanges use its alternate exchange (RabbitMQ policies). Idempotent."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--vhost",
            action="append",
            dest="vhosts",
            help="vhost to wire (repeatable; default: RECOVERY_VHOSTS)",
        )
        parser.add_argument("--queues", help="regex of application queues to dead-letter")
        parser.add_argument("--exchanges", help="regex of application exchanges to protect")

    def handle(self, *args, vhosts=None, queues=None, exchanges=None, **options):
        for vhost in vhosts or settings.RECOVERY_VHOSTS:
            try:
                report = wire(vhost, queues_regex=queues, exchanges_regex=exchanges)
            except ManagementError as exc:
                raise CommandError(f"{exc} (is the management plugin enabled?)") from exc
            except Exception as exc:
                raise CommandError(f"cannot wire vhost {vhost!r}: {exc!r}") from exc
            self.stdout.write(
                f"vhost {vhost}: declared {', '.join(report['declared'])}"
                + (f"; policy {report['queue_policy']} on /{queues}/" if queues else "")
                + (f"; policy {report['exchange_policy']} on /{exchanges}/" if exchanges else "")
            )
