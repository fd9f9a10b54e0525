"""The recovery topology (DESIGN.md "Broker topology") and the wiring of application queues.

Everything here is idempotent: declaring what exists with the same arguments is a no-op, and
policies are PUT by name.
"""

from dataclasses import dataclass

from django.conf import settings

from recovery.broker.connection import connect
from recovery.broker.management import Management

QUORUM = {"x-queue-type": "quorum"}

# Policy names Lazarus owns. RabbitMQ applies only the highest-priority policy that matches a
# queue, so an application that already has policies on its queues must add
# dead-letter-exchange to its own policy instead (README: "Wiring an existing RabbitMQ").
DLX_POLICY = "lazarus-dead-letter"
AE_POLICY = "lazarus-alternate-exchange"


@dataclass(frozen=True)
class Names:
    dlx: str
    dead_letters: str
    unrouted: str
    returns: str
    quarantine: str

    @classmethod
    def from_settings(cls):
        return cls(
            dlx=settings.RECOVERY_DLX,
            dead_letters=settings.RECOVERY_DEAD_LETTER_QUEUE,
            unrouted=settings.RECOVERY_UNROUTED,
            returns=settings.RECOVERY_RETURNS_QUEUE,
            quarantine=settings.RECOVERY_QUARANTINE_QUEUE,
        )

    @property
    def source_queues(self):
        """The queues the collector drains."""
        return (self.dead_letters, self.unrouted, self.returns)


def declare_recovery_topology(channel, names=None):
    names = names or Names.from_settings()
    channel.exchange_declare(names.dlx, "topic", durable=True)
    channel.queue_declare(names.dead_letters, durable=True, arguments=QUORUM)
    channel.queue_bind(names.dead_letters, names.dlx, "#")
    channel.exchange_declare(names.unrouted, "fanout", durable=True)
    channel.queue_declare(names.unrouted, durable=True, arguments=QUORUM)
    channel.queue_bind(names.unrouted, names.unrouted)
    channel.queue_declare(names.returns, durable=True, arguments=QUORUM)
    channel.queue_declare(names.quarantine, durable=True, arguments=QUORUM)
    return names


def wire(vhost, queues_regex=None, exchanges_regex=None, management=None, names=None):
    """Declare the recovery topology in a vhost, apply the DLX and AE policies; return a report."""
    names = names or Names.from_settings()
    conn = connect(vhost)
    try:
        declare_recovery_topology(conn.channel(), names)
    finally:
        conn.close()
    report = {"vhost": vhost, "declared": [names.dlx, *names.source_queues, names.quarantine]}
    management = management or Management()
    if queues_regex:
        # Never dead-letter the recovery queues into themselves.
        management.put_policy(
            vhost,
            DLX_POLICY,
            f"^(?!{_escape(names.dead_letters)}$|{_escape(names.unrouted)}$|"
            f"{_escape(names.returns)}$|{_escape(names.quarantine)}$)(?:{queues_regex})",
            {"dead-letter-exchange": names.dlx},
            "queues",
        )
        report["queue_policy"] = DLX_POLICY
    if exchanges_regex:
        management.put_policy(
            vhost,
            AE_POLICY,
            f"^(?!{_escape(names.unrouted)}$|{_escape(names.dlx)}$|amq\\.)(?:{exchanges_regex})",
            {"alternate-exchange": names.unrouted},
            "exchanges",
        )
        report["exchange_policy"] = AE_POLICY
    return report


def _escape(name):
    return "".join("\\" + ch if ch in ".^$*+?()[]{}|\\" else ch for ch in name)


def queue_depths(vhost, names=None):
    """Ready + unacked message counts of the collector's source queues (the collector's lag)."""
    names = names or Names.from_settings()
    conn = connect(vhost)
    depths = {}
    try:
        for queue in (*names.source_queues, names.quarantine):
            channel = conn.channel()
            try:
                depths[queue] = channel.queue_declare(queue, passive=True).method.message_count
            except Exception:  # noqa: BLE001 - a missing queue means "not wired", reported as None
                depths[queue] = None
    finally:
        if conn.is_open:
            conn.close()
    return depths
