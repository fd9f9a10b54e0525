"""The recovery store: one Message row per collected message, its search document, and the
collector processes' heartbeats. Its counts: ``recovery.models.counts``."""

import datetime

from django.contrib.postgres.indexes import GinIndex
from django.db import models
from django.db.models.functions import Coalesce
from django.utils import timezone

from recovery.client import headers as header_codec


class Kind(models.TextChoices):
    DEAD_LETTER = "dead_letter"
    UNROUTABLE = "unroutable"
    RETURNED = "returned"
    NACKED = "nacked"
    UNCONFIRMED = "unconfirmed"


class Reason(models.TextChoices):
    REJECTED = "rejected"
    EXPIRED = "expired"
    MAXLEN = "maxlen"
    DELIVERY_LIMIT = "delivery_limit"
    NO_ROUTE = "no_route"
    NACK = "nack"
    TIMEOUT = "timeout"
    UNKNOWN = "unknown"


class Status(models.TextChoices):
    PENDING = "pending"
    REPLAYING = "replaying"
    REPLAYED = "replayed"
    DISCARDED = "discarded"
    POISONED = "poisoned"


# The status sets, defined once. Replayable = discardable: anything not in flight or discarded.
REPLAYABLE = (Status.PENDING, Status.POISONED, Status.REPLAYED)
DISCARDABLE = REPLAYABLE
RESTORABLE = (Status.DISCARDED,)
# "Open": still needs someone (the overview's and the groups' open counts).
OPEN = (Status.PENDING, Status.POISONED, Status.REPLAYING)

# Not a stored status: a replayed message whose latest replay was dead-lettered again and
# collected (Message.state). Derived, so nothing has to be written when the copy arrives.
DIED_AGAIN = "died_again"


def default_target_of(kind, source_queue, source_exchange, routing_keys):
    """Message.default_target for raw column values (bulk replay reads rows, not models)."""
    if kind == Kind.DEAD_LETTER and source_queue:
        return "", source_queue
    return source_exchange, (routing_keys[0] if routing_keys else "")


# Retry counters frameworks and hand-written retry loops keep in a header (the first present wins):
# the common custom names, Spring Cloud Stream's, MassTransit's, NServiceBus's, Celery's.
APP_RETRY_HEADERS = (
    "x-retry-count",
    "x-retries",
    "retry-count",
    "retries",
    "deliveryAttempt",
    "MT-Redelivery-Count",
    "NServiceBus.Retries",
)


# Exactly once: the store's unique key of a delivery, its fingerprint (a hash of its content,
# equal for a redelivery) led by the time of its last death (also read from its content, its
# x-death header, so equal for a redelivery too; a message with no death time: NO_DEATH_TIME).
# Two rows with the same fingerprint have the same headers, hence the same death time, so the
# key is as unique as the fingerprint alone. The time leads so that the index grows at its
# newest end, as dead letters arrive: keyed by the hash alone, every insert landed on a random
# leaf page of the whole store's index (at 10M stored: 0.94 pages read from outside
# shared_buffers and 0.81 full-page WAL images per message, three times the WAL of an empty
# store; docs/big-store.md). The collector's and the archive import's ON CONFLICT name it.
NO_DEATH_TIME = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
FINGERPRINT_KEY = "(COALESCE(last_death_at, '1970-01-01 00:00:00+00'::timestamptz)), fingerprint"


class Message(models.Model):
    kind = models.CharField(max_length=16, choices=Kind.choices)
    vhost = models.CharField(max_length=255, default="/")
    source_queue = models.CharField(max_length=255, blank=True, default="")
    source_exchange = models.CharField(max_length=255, blank=True, default="")
    routing_keys = models.JSONField(default=list)
    reason = models.CharField(max_length=16, choices=Reason.choices, default=Reason.UNKNOWN)
    death_count = models.IntegerField(default=0)
    first_death_at = models.DateTimeField(null=True, blank=True)
    last_death_at = models.DateTimeField(null=True, blank=True)
    message_id = models.CharField(max_length=255, blank=True, default="")
    correlation_id = models.CharField(max_length=255, blank=True, default="")
    # All AMQP basic properties except headers, JSON-encoded with recovery.client.headers.
    properties = models.JSONField(default=dict)
    headers = models.JSONField(default=dict)
    body = models.BinaryField()
    body_size = models.IntegerField()
    content_type = models.CharField(max_length=255, blank=True, default="")
    content_encoding = models.CharField(max_length=255, blank=True, default="")
    # Unique through Meta.constraints (msg_fingerprint, led by the last death's time: see
    # FINGERPRINT_KEY): unique=True would add a varchar_pattern_ops twin index that nothing
    # queries and every insert pays for.
    fingerprint = models.CharField(max_length=64)
    group_key = models.CharField(max_length=64)
    group_label = models.TextField(blank=True, default="")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    status_reason = models.TextField(blank=True, default="")
    replay_count = models.IntegerField(default=0)
    # A replayed message that died again points at the record it was replayed from.
    # Indexed only where set (msg_origin): most messages never came back from a replay.
    origin = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="returns",
        db_index=False,
    )
    collected_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)
    last_replayed_at = models.DateTimeField(null=True, blank=True)
    # Soft discard (recovery.replay.discard_message): restore puts back the status it had.
    # db_default because the collector inserts rows with raw SQL naming only its own columns.
    discarded_at = models.DateTimeField(null=True, blank=True)
    status_before_discard = models.CharField(max_length=16, blank=True, default="", db_default="")

    class Meta:
        ordering = ["-collected_at", "-id"]
        # Every index here is paid by each collected row and, since status is indexed, by each
        # replay's status update (no HOT updates): keep only what a page or query uses.
        constraints = [
            models.UniqueConstraint(
                Coalesce("last_death_at", models.Value(NO_DEATH_TIME)),
                "fingerprint",
                name="msg_fingerprint",
            )
        ]
        indexes = [
            models.Index(fields=["-collected_at", "-id"], name="msg_newest"),
            models.Index(fields=["kind", "-collected_at", "-id"], name="msg_kind_newest"),
            models.Index(fields=["status", "-collected_at", "-id"], name="msg_status_newest"),
            models.Index(fields=["source_queue", "-collected_at", "-id"], name="msg_queue_newest"),
            models.Index(fields=["reason", "-collected_at", "-id"], name="msg_reason_newest"),
            models.Index(fields=["source_exchange", "-collected_at"], name="msg_exchange_newest"),
            models.Index(fields=["message_id"], name="msg_message_id"),
            # Partial: a search never asks for an empty correlation id (recovery.search), and
            # rows without one (most events) then cost no entry, on insert or on a replay's
            # update. Likewise the origin, set only on a message that died again after a replay.
            models.Index(
                fields=["correlation_id"],
                name="msg_correlation_id",
                condition=~models.Q(correlation_id=""),
            ),
            models.Index(
                fields=["origin"], name="msg_origin", condition=models.Q(origin__isnull=False)
            ),
            # Failure-group pages: first/last seen and the newest messages of one group.
            models.Index(fields=["group_key", "-collected_at", "-id"], name="msg_group_newest"),
            # Retention's own (recovery.retention.run): the messages it may delete, oldest
            # change first. Partial, so the collector's inserts (pending) never pay for it; a
            # replay or discard adds its entry. Without it each batch was picked by walking
            # msg_status_newest past every replayed message not yet expired (and the dead
            # entries of the batches before): at 10M stored, batches slowed to 170 deletes/s.
            models.Index(
                fields=["updated_at", "id"],
                name="msg_expirable",
                condition=models.Q(status__in=["replayed", "discarded"]),
            ),
            # Free-text search has its own table (MessageSearch), so no trigram index here.
        ]

    def __str__(self):
        return f"{self.kind} {self.message_id or self.pk} from {self.source_queue}"

    @property
    def wire_headers(self):
        return header_codec.headers_from_json(self.headers)

    @property
    def x_death(self):
        return [header_codec.plain(entry) for entry in self.headers.get("x-death", [])]

    @property
    def counts_attempts(self):
        """A publish our client library handed over (nacked, unconfirmed, returned to it): its
        ``death_count`` counts publish attempts, and it never died in a queue."""
        return self.kind in (Kind.NACKED, Kind.UNCONFIRMED) or (
            self.kind == Kind.RETURNED and not self.source_queue
        )

    @property
    def body_bytes(self):
        return bytes(self.body)

    @property
    def app_retry_count(self):
        """(header, value) of the application's own retry counter, or None. From RabbitMQ 3.13
        the broker ignores an ``x-death`` a client publishes, so a retry loop that republishes
        restarts ``death_count``; the counter a framework keeps says how often it really tried
        (docs/compatibility.md)."""
        for name in APP_RETRY_HEADERS:
            value = header_codec.plain(self.headers.get(name)) if name in self.headers else None
            if isinstance(value, int) and not isinstance(value, bool):
                return name, value
            if isinstance(value, str) and value.isdigit():
                return name, int(value)
        return None

    @property
    def is_transient(self):
        """Published without delivery_mode 2 (an AMQP 1.0 message without ``durable`` arrives
        so from RabbitMQ 4.x): a replay sends it transient too, and a broker restart before it
        is consumed loses it."""
        return (self.properties or {}).get("delivery_mode") != 2

    @property
    def died_again_copy_id(self):
        """The copy collected after this message's latest replay was dead-lettered again (or
        unroutable), None if there is none. Read per page by ``attach_died_again``."""
        if not hasattr(self, "_died_again_copy_id"):
            attach_died_again([self])
        return self._died_again_copy_id

    @property
    def state(self):
        """The status an operator sees: ``died_again`` instead of a "replayed" that came back."""
        return DIED_AGAIN if self.died_again_copy_id else self.status

    def default_target(self):
        """(exchange, routing_key) of the default replay target (docs/design.md "Replay semantics").

        A dead letter goes back to the queue it died in through the default exchange, so a fanout
        is never re-fanned to queues that already consumed it. Unroutable and returned messages go
        back to their original exchange and routing key.
        """
        return default_target_of(
            self.kind, self.source_queue, self.source_exchange, self.routing_keys
        )


def attach_died_again(messages):
    """Set ``died_again_copy_id`` on each message (one query for a page, through msg_origin).

    A replay publishes ``x-recovery-replay-count`` = the message's replay_count + 1, and a
    confirmed replay moves replay_count to that same number; the collector stores the header as
    the copy's replay_count. So a copy whose replay_count reaches the message's came back from
    its latest replay, while a late copy of an older replay does not make a newer one look dead.
    Only ``replayed`` rows are looked up: every other status already says it needs someone.
    """
    messages = list(messages)
    replayed = {}
    for message in messages:
        message._died_again_copy_id = None
        if message.status == Status.REPLAYED:
            replayed[message.pk] = message
    if replayed:
        copies = (
            Message.objects.filter(origin_id__in=list(replayed))
            .values_list("origin_id", "replay_count", "id")
            .order_by("id")
        )
        for origin_id, replay_count, copy_id in copies:
            message = replayed[origin_id]
            if replay_count >= message.replay_count:
                message._died_again_copy_id = copy_id  # the newest copy wins
    return messages


class MessageSearch(models.Model):
    """The free-text search document of one message: ids, headers and body text, trigram-indexed.

    A side table rather than an index on Message: trigram indexing costs PostgreSQL ~100 us of
    CPU per row, which the collector's inserts and every replay status update (status is indexed,
    so no HOT updates) would otherwise pay. recovery.search.index fills it shortly after a
    message is stored (Celery beat), and a search also reads the not-yet-indexed newest rows
    directly (recovery.search.filters.search_q), so nothing is unsearchable meanwhile.
    Insert-only: a
    message's ids, headers and body never change (an edit is a MessageEdit). The database
    deletes the row with its message (ON DELETE CASCADE, migration 0010).
    """

    message = models.OneToOneField(
        Message,
        primary_key=True,
        on_delete=models.DO_NOTHING,  # the database cascades: no per-row work in Django
        db_constraint=False,  # the cascading constraint is created by migration 0010
        related_name="+",
    )
    document = models.TextField()

    class Meta:
        indexes = [
            GinIndex(fields=["document"], opclasses=["gin_trgm_ops"], name="msgsearch_trgm"),
        ]


class CollectorHeartbeat(models.Model):
    """One row per running collector thread, upserted every few seconds (healthz, console)."""

    worker = models.CharField(max_length=255)
    vhost = models.CharField(max_length=255)
    queue = models.CharField(max_length=255)
    collected = models.BigIntegerField(default=0)
    duplicates = models.BigIntegerField(default=0)
    quarantined = models.BigIntegerField(default=0)
    errors = models.BigIntegerField(default=0)
    last_error = models.TextField(blank=True, default="")
    # Messages stored per second between the last two heartbeats.
    rate = models.FloatField(default=0.0)
    last_collected_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["worker", "vhost", "queue"], name="heartbeat_unique")
        ]
