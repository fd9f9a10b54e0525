"""Counted twice: what the broker says it dead-lettered or dropped, against what Lazarus stored.

RabbitMQ 3.10+ keeps global counters (exposed by the ``rabbitmq_prometheus`` plugin on each
node's :15692/metrics):

- ``rabbitmq_global_messages_dead_lettered_{rejected,expired,maxlen,delivery_limit}_total``
  by ``queue_type`` and ``dead_letter_strategy``: ``at_most_once`` / ``at_least_once`` went to
  a dead-letter exchange; ``disabled`` means the queue had none: the message was discarded.
- ``rabbitmq_global_messages_unroutable_dropped_total``: publishes no queue got and nobody was
  told of (no ``mandatory``, no alternate exchange) — gone; ``..._returned_total``: returned to
  a ``mandatory`` publisher (its client library's business, shown for information).

Beat records a sample every BROKER_TALLY_SECONDS (recovery/broker/tasks.py; the comparison with
the store is ``BrokerTally.objects.record``, recovery/models/broker.py). Per interval:
``gap = dead_lettered - stored dead letters - change of the recovery queues' backlog``, so
messages still waiting for the collector are not a gap, and a gap that stays is dead letters
the broker sent somewhere Lazarus never got them (a DLX with no queue bound, a purge, a DLX
that is not Lazarus's). The counters are per node and broker-wide (every vhost): a cluster
lists every node's URL in RABBITMQ_PROMETHEUS_URLS; a broker that dead-letters to other DLXs
on purpose shows that as a steady gap (docs/alerts.md says how to read it).

Counters that cannot be read make a sample with ``error`` and no figures: that interval is
unknown, shown and alerted on as such, never as zero.
"""

import urllib.request

from django.conf import settings
from prometheus_client.parser import text_string_to_metric_families

from recovery.broker.management import Management
from recovery.broker.topology import Names, declared_counts

PREFIX = "rabbitmq_global_messages_"
REASONS = ("rejected", "expired", "maxlen", "delivery_limit")
SCRAPE_TIMEOUT_S = 10
TO_DLX = ("at_most_once", "at_least_once")  # the strategies that send to a dead-letter exchange


# Series that are not application messages Lazarus could have kept. A volatile queue (4.x:
# direct reply-to, "amq.rabbitmq.reply-to") drops a reply nobody waits for by design; it has no
# dead-letter exchange to give, so counting it as "discarded" would raise a false alarm.
NOT_APPLICATION_QUEUE_TYPES = frozenset(("rabbit_volatile_queue",))
# The unroutable counters are per protocol. Lazarus's alternate exchange, client library and
# collector deal in AMQP 0-9-1; the series RabbitMQ 4.x adds for AMQP 1.0 (and MQTT, STOMP)
# count sends of other clients that Lazarus has no part in, and are left out of the tally
# (docs/compatibility.md). Before 4.0 the label may be absent.
TALLIED_PROTOCOLS = frozenset(("amqp091", ""))


def application_queue(labels):
    return labels.get("queue_type", "") not in NOT_APPLICATION_QUEUE_TYPES


def tallied_protocol(labels):
    return labels.get("protocol", "") in TALLIED_PROTOCOLS


class CountersUnavailable(Exception):
    """The broker's counters could not be read (plugin off, node down, too old a RabbitMQ)."""


def parse(text) -> dict[str, float]:
    """The counters the tally reads from one node's Prometheus text, summed over queue types:
    ``dead_lettered:<reason>:<strategy>``, ``unroutable_dropped``, ``unroutable_returned``."""
    series: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name
            if not name.startswith(PREFIX) or not name.endswith("_total"):
                continue
            what = name[len(PREFIX) : -len("_total")]
            if what.startswith("dead_lettered_"):
                reason = what[len("dead_lettered_") :]
                if reason not in REASONS:  # dead_lettered_confirmed: a transfer, not a death
                    continue
                if not application_queue(sample.labels):
                    continue
                strategy = sample.labels.get("dead_letter_strategy", "")
                key = f"dead_lettered:{reason}:{strategy}"
            elif what in ("unroutable_dropped", "unroutable_returned"):
                if not tallied_protocol(sample.labels):
                    continue
                key = what
            else:
                continue
            series[key] = series.get(key, 0) + sample.value
    if not any(key.startswith("dead_lettered:") for key in series):
        raise CountersUnavailable(
            "no rabbitmq_global_messages_dead_lettered_* counters: RabbitMQ 3.10 or later with "
            "the rabbitmq_prometheus plugin is needed"
        )
    return series


def scrape(urls=None) -> dict[str, dict[str, float]]:
    """{node url: parse(its /metrics)}; CountersUnavailable names the node that failed."""
    counters = {}
    for url in urls if urls is not None else settings.RABBITMQ_PROMETHEUS_URLS:
        try:
            with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT_S) as response:
                text = response.read().decode("utf-8", errors="replace")
        except OSError as exc:
            raise CountersUnavailable(f"{url}: {exc}") from exc
        try:
            counters[url] = parse(text)
        except CountersUnavailable as exc:
            raise CountersUnavailable(f"{url}: {exc}") from exc
        except ValueError as exc:  # not Prometheus text
            raise CountersUnavailable(f"{url}: not Prometheus text ({exc})") from exc
    if not counters:
        raise CountersUnavailable("RABBITMQ_PROMETHEUS_URLS is empty")
    return counters


def deltas(previous, current):
    """Per series, how much each counter rose between two samples, summed over nodes; and the
    nodes whose counters went back (restarted: their whole count is this interval's). A node
    not in ``previous`` is a baseline (nothing of its count is known to be this interval's)."""
    total: dict[str, float] = {}
    resets = []
    for node, series in current.items():
        before = previous.get(node)
        if before is None:
            continue
        if any(value < before.get(key, 0) for key, value in series.items()):
            resets.append(node)
            before = {}
        for key, value in series.items():
            total[key] = total.get(key, 0) + value - before.get(key, 0)
    return total, resets


def backlog(management=None) -> int:
    """Dead letters the broker has delivered to Lazarus's queues that are not stored yet (ready
    or unacked in the dead-letter queue, parked past a delivery limit, or set aside in
    quarantine), over the watched vhosts.

    Where the management API leaves ``messages`` out (statistics disabled) the count comes from a
    passive declare, which counts ready messages only: what the collector holds unacked then
    shows as a gap for one interval and as its opposite in the next. A queue neither can count
    raises (the sample is unknown, never a backlog of 0)."""
    management = management or Management()
    names = Names.from_settings()
    queues = (names.dead_letters, names.parked, names.quarantine)
    waiting = 0
    for vhost in settings.RECOVERY_VHOSTS:
        missing = []
        for name in queues:
            messages = (management.queue(vhost, name) or {}).get("messages")
            if messages is None:
                missing.append(name)
            else:
                waiting += messages
        for name, counts in declared_counts(vhost, missing).items() if missing else ():
            if counts is None:
                raise CountersUnavailable(f"{vhost}/{name}: cannot count its messages")
            waiting += counts[0]
    return waiting


def compare(rose, stored):
    """{reason: {broker, discarded, stored}} for one interval: the broker's dead-letterings to a
    DLX (at most or at least once), its discards (no DLX), and the dead letters Lazarus stored
    (stored reasons the broker does not count, e.g. a framework's republish, go under other)."""
    by_reason = {}
    for reason in REASONS:
        sent = sum(rose.get(f"dead_lettered:{reason}:{s}", 0) for s in TO_DLX)
        gone = rose.get(f"dead_lettered:{reason}:disabled", 0)
        kept = stored.get(("dead_letter", reason), 0)
        if sent or gone or kept:
            by_reason[reason] = {"broker": int(sent), "discarded": int(gone), "stored": kept}
    other = sum(
        n for (kind, reason), n in stored.items() if kind == "dead_letter" and reason not in REASONS
    )
    if other:
        by_reason["other"] = {"broker": 0, "discarded": 0, "stored": other}
    return by_reason
