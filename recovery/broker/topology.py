"""The recovery topology (docs/design.md "Broker topology") and the wiring of application queues.

Everything here is idempotent: declaring what exists with the same arguments is a no-op, and
policies are PUT by name.
"""

import re
from dataclasses import dataclass

from django.conf import settings

from recovery.broker.connection import connect
from recovery.broker.management import Management
from recovery.errors import ManagementError

QUORUM = {"x-queue-type": "quorum"}
# The parking queue is a classic queue: classic queues have no delivery limit on any version, so
# nothing a consumer does to it can make the broker drop what it holds.
CLASSIC = {"x-queue-type": "classic"}

# Policy names Lazarus owns. RabbitMQ applies only the highest-priority policy that matches a
# queue, so an application that already has policies on its queues must add
# dead-letter-exchange to its own policy instead (README: "Wiring an existing RabbitMQ").
DLX_POLICY = "lazarus-dead-letter"
AE_POLICY = "lazarus-alternate-exchange"
# On Lazarus's own source queues (docs/decisions.md "Delivery limit"): no delivery limit where the
# broker has one by default (4.0+), and past any limit an operator policy or a queue argument
# still sets, dead-lettered at least once into the parking queue the collector drains.
RECOVERY_POLICY = "lazarus-recovery-queues"
# On recovery.quarantine (people read it in the management UI, and "get messages" with requeue
# is a return): no delivery limit on 4.0+. It does not dead-letter: a parked quarantined message
# would go back through the collector to the quarantine.
QUARANTINE_POLICY = "lazarus-quarantine"
# Higher than any policy an application is likely to match the recovery queues with (a ".*"
# catch-all with a max-length or a TTL would make them drop messages too): RabbitMQ applies one
# policy per queue, ours wins. A user policy with a higher priority still hides it; the coverage
# check then flags the queue (recovery_limits).
RECOVERY_POLICY_PRIORITY = 1000
# RabbitMQ 4.0 gave quorum queues a default delivery limit of 20; -1 turns it off. Before 4.0
# there is no default, and the policy validator refuses a negative delivery-limit.
UNLIMITED = -1
FIRST_VERSION_WITH_DEFAULT_LIMIT = (4, 0)


@dataclass(frozen=True)
class Names:
    dlx: str
    dead_letters: str
    unrouted: str
    returns: str
    quarantine: str
    parked: str = "recovery.parked"

    @classmethod
    def from_settings(cls):
        return cls(
            dlx=settings.RECOVERY_DLX,
            dead_letters=settings.RECOVERY_DEAD_LETTER_QUEUE,
            unrouted=settings.RECOVERY_UNROUTED,
            returns=settings.RECOVERY_RETURNS_QUEUE,
            quarantine=settings.RECOVERY_QUARANTINE_QUEUE,
            parked=settings.RECOVERY_PARKED,
        )

    @property
    def source_queues(self):
        """The queues the collector drains."""
        return (self.dead_letters, self.unrouted, self.returns, self.parked)

    @property
    def limited_queues(self):
        """The source queues that can have a delivery limit (quorum queues) and park past it."""
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
    channel.exchange_declare(names.parked, "fanout", durable=True)
    channel.queue_declare(names.parked, durable=True, arguments=CLASSIC)
    channel.queue_bind(names.parked, names.parked)
    return names


def broker_version(management):
    """(major, minor) of the broker's RabbitMQ, or None when the management API does not say."""
    try:
        version = (management.overview() or {}).get("rabbitmq_version") or ""
        major, minor = version.split(".")[:2]
        return int(major), int(minor)
    except (ManagementError, ValueError):
        return None


def recovery_policies(names, version):
    """(name, pattern, definition) of the policies ``wire`` puts on Lazarus's own queues.

    ``version`` None (unknown) is treated as 4.0+: a refused policy fails ``wire`` loudly, a
    missing one would leave the default limit of 20 in place without a word."""
    unlimited = version is None or version >= FIRST_VERSION_WITH_DEFAULT_LIMIT
    limit = {"delivery-limit": UNLIMITED} if unlimited else {}
    sources = "|".join(_escape(q) for q in names.limited_queues)
    policies = [
        (
            RECOVERY_POLICY,
            f"^(?:{sources})$",
            {"dead-letter-exchange": names.parked, **AT_LEAST_ONCE, **limit},
        )
    ]
    if limit:
        policies.append((QUARANTINE_POLICY, f"^{_escape(names.quarantine)}$", limit))
    return policies


# What --at-least-once adds to the dead-letter policy. RabbitMQ 3.10+ dead-letters a quorum
# queue's messages at least once with this strategy: the source queue keeps a message until
# recovery.dlx's queues confirm it, so it survives a node lost on the way (the default,
# at-most-once, forgets it as it sends). The strategy requires overflow reject-publish (a full
# queue refuses new publishes, which the publisher's confirms see, instead of dropping its head).
# Classic queues ignore the strategy; on them reject-publish only matters with a length limit.
AT_LEAST_ONCE = {"dead-letter-strategy": "at-least-once", "overflow": "reject-publish"}


def wire(
    vhost,
    queues_regex=None,
    exchanges_regex=None,
    management=None,
    names=None,
    at_least_once=False,
):
    """Declare the recovery topology in a vhost, apply the DLX and AE policies; return a report.

    ``at_least_once``: the dead-letter policy also sets ``AT_LEAST_ONCE`` (for quorum
    application queues); the report names the matching queues that are not quorum queues."""
    names = names or Names.from_settings()
    conn = connect(vhost)
    try:
        declare_recovery_topology(conn.channel(), names)
    finally:
        conn.close()
    report = {"vhost": vhost, "declared": [names.dlx, *names.source_queues, names.quarantine]}
    management = management or Management()
    version = broker_version(management)
    for name, pattern, definition in recovery_policies(names, version):
        management.put_policy(
            vhost, name, pattern, definition, "queues", priority=RECOVERY_POLICY_PRIORITY
        )
    report["recovery_policy"] = RECOVERY_POLICY
    if queues_regex:
        # Never dead-letter the recovery queues into themselves.
        pattern = (
            f"^(?!{_escape(names.dead_letters)}$|{_escape(names.unrouted)}$|"
            f"{_escape(names.returns)}$|{_escape(names.quarantine)}$|"
            f"{_escape(names.parked)}$)(?:{queues_regex})"
        )
        definition = {"dead-letter-exchange": names.dlx}
        if at_least_once:
            definition |= AT_LEAST_ONCE
        management.put_policy(vhost, DLX_POLICY, pattern, definition, "queues")
        report["queue_policy"] = DLX_POLICY
        if at_least_once:
            report["not_quorum"] = sorted(
                q["name"]
                for q in management.queues(vhost) or []
                if re.search(pattern, q["name"]) and q.get("type") != "quorum"
            )
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
    """Ready message counts of the collector's source queues and the quarantine, by passive
    declare (the collector's lag; None: not declared)."""
    names = names or Names.from_settings()
    counts = declared_counts(vhost, (*names.source_queues, names.quarantine))
    return {queue: c and c[0] for queue, c in counts.items()}


def declared_counts(vhost, queues):
    """{queue: (ready messages, consumers)} by passive declare, or None for a queue that is not
    declared. The AMQP answer needs no management statistics: it is what Lazarus falls back to
    when the management API leaves the numbers out (statistics disabled). It counts ready
    messages only (unacked ones are in a consumer's hands)."""
    conn = connect(vhost)
    counts: dict[str, tuple[int, int] | None] = {}
    try:
        for queue in queues:
            channel = conn.channel()
            try:
                method = channel.queue_declare(queue, passive=True).method
                counts[queue] = (method.message_count, method.consumer_count)
            except Exception:  # noqa: BLE001 - a missing queue means "not wired", reported as None
                counts[queue] = None
    finally:
        if conn.is_open:
            conn.close()
    return counts
