from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from recovery.broker.topology import wire
from recovery.broker.trace import wire_trace
from recovery.errors import ManagementError


class Command(BaseCommand):
    help = (
        "Declare the recovery topology (DLX, dead-letter, unrouted, returns, parked and "
        "quarantine queues), put the policy that keeps a delivery limit from dropping the "
        "recovery queues' messages on them (existing deployments: run it again after an "
        "upgrade) and, with --queues/--exchanges, make matching application queues dead-letter "
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
        parser.add_argument(
            "--at-least-once",
            action="store_true",
            help="with --queues: quorum queues dead-letter at least once (RabbitMQ 3.10+: "
            "dead-letter-strategy at-least-once, overflow reject-publish), so a message survives "
            "a node lost on its way to the dead-letter queue",
        )

        parser.add_argument(
            "--trace",
            choices=("on", "off"),
            help="only the firehose (#48): 'on' declares RECOVERY_TRACE_QUEUE bound to "
            "amq.rabbitmq.trace and turns tracing on for the vhosts on every node; 'off' turns "
            "it off and leaves the trace queue and what it holds",
        )

    def handle(self, *args, vhosts=None, queues=None, exchanges=None, **options):
        if options.get("trace"):
            return self.handle_trace(vhosts or settings.RECOVERY_VHOSTS, options["trace"] == "on")
        at_least_once = options.get("at_least_once", False)
        if at_least_once and not queues:
            raise CommandError("--at-least-once applies to the queues of --queues")
        for vhost in vhosts or settings.RECOVERY_VHOSTS:
            try:
                report = wire(
                    vhost,
                    queues_regex=queues,
                    exchanges_regex=exchanges,
                    at_least_once=at_least_once,
                )
            except ManagementError as exc:
                raise CommandError(f"{exc} (is the management plugin enabled?)") from exc
            except Exception as exc:
                raise CommandError(f"cannot wire vhost {vhost!r}: {exc!r}") from exc
            self.stdout.write(
                f"vhost {vhost}: declared {', '.join(report['declared'])}"
                + f"; policy {report['recovery_policy']} on the recovery queues"
                + (f"; policy {report['queue_policy']} on /{queues}/" if queues else "")
                + (f"; policy {report['exchange_policy']} on /{exchanges}/" if exchanges else "")
                + ("; dead-lettering at least once" if at_least_once else "")
            )
            if report.get("not_quorum"):
                # Said, not hidden: these queues still dead-letter at most once.
                self.stderr.write(
                    f"vhost {vhost}: not quorum queues, the at-least-once strategy does not apply "
                    f"to them: {', '.join(report['not_quorum'])}"
                )

    def handle_trace(self, vhosts, on):
        for vhost in vhosts:
            try:
                report = wire_trace(vhost, on)
            except ManagementError as exc:
                raise CommandError(f"{exc} (is the management plugin enabled?)") from exc
            except Exception as exc:
                raise CommandError(f"cannot set tracing on vhost {vhost!r}: {exc!r}") from exc
            if on:
                self.stdout.write(
                    f"vhost {vhost}: {report['queue_type']} {report['queue']} bound to "
                    f"amq.rabbitmq.trace; tracing {'on' if report['tracing'] else 'NOT on'}"
                )
            else:
                self.stdout.write(
                    f"vhost {vhost}: tracing {'still ON' if report['tracing'] else 'off'}; "
                    f"{report['queue']} left as it is (the tap drains it; delete it by hand)"
                )
            if report["tracing"] != on:
                raise CommandError(f"vhost {vhost}: the broker did not take tracing={on}")
