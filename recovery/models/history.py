"""What was done to each message, kept after retention deleted the message itself.

One compact ``MessageHistory`` row per action on a message: a replay (one click, edited or by a
bulk job) with its outcome, a discard, a restore, and retention's delete. It copies what a
reader needs to answer "was order 123 ever replayed, by whom, and did it arrive?" (the
``message_id``, where it died, its failure group, who, when, the job, the outcome, the target)
instead of pointing at the message, so it outlives RETENTION_DAYS; it is kept for HISTORY_DAYS.

Written in the transaction that records the action (beside the activity row and the attempt),
by one statement per batch: the rows are copied from the message rows themselves
(``record_messages``), or by the bulk replay's own statement (recovery.replay.job_store).
"""

from datetime import timedelta

from django.conf import settings
from django.db import connection, models, transaction
from django.utils import timezone


class HistoryAction(models.TextChoices):
    REPLAY = "replay"
    EDIT_REPLAY = "edit_replay", "edit and replay"
    DISCARD = "discard"
    RESTORE = "restore"
    # By retention: the message left the store, its history stays.
    DELETED = "deleted", "deleted by retention"


class MessageHistory(models.Model):
    # The AMQP message id ('' when the message had none) and the store row it was (gone once
    # retention deleted it): no foreign key, the row must outlive the message.
    message_id = models.CharField(max_length=255, blank=True, default="")
    store_id = models.BigIntegerField()
    vhost = models.CharField(max_length=255)
    queue = models.CharField(max_length=255, blank=True, default="")
    group_key = models.CharField(max_length=64, blank=True, default="")
    group_label = models.TextField(blank=True, default="")
    action = models.CharField(max_length=16, choices=HistoryAction.choices)
    # The username then (it outlives the user too); '' = the system (retention).
    who = models.CharField(max_length=150, blank=True, default="")
    via = models.CharField(max_length=8, default="console")  # console | api | system
    at = models.DateTimeField(default=timezone.now)
    job_id = models.BigIntegerField(null=True, blank=True)
    # A replay's outcome (ReplayAttempt.Outcome: confirmed = the broker has it); '' otherwise.
    outcome = models.CharField(max_length=16, blank=True, default="")
    target_exchange = models.CharField(max_length=255, blank=True, default="")
    target_routing_key = models.CharField(max_length=255, blank=True, default="")
    # Why: the broker's reason for a return or refusal, a discard's reason, ...
    detail = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["-at", "-id"]
        verbose_name_plural = "message history"
        # A bulk replay writes one row per message: two indexes, both read (the search by
        # message id, newest first; the newest-first list and its retention by time).
        indexes = [
            models.Index(fields=["message_id", "-at", "-id"], name="history_message_id"),
            models.Index(fields=["-at", "-id"], name="history_newest"),
        ]

    def __str__(self):
        return f"{self.action} {self.message_id or self.store_id} at {self.at:%Y-%m-%d %H:%M:%S}"

    @classmethod
    def record_messages(
        cls,
        ids,
        action,
        user=None,
        via="console",
        job_id=None,
        outcome="",
        exchange="",
        routing_key="",
        detail="",
    ):
        """One ``action`` row per message of ``ids``, copied from the message rows in one
        statement (so call it before deleting them); returns how many. Part of the caller's
        transaction."""
        ids = list(ids)
        if not ids:
            return 0
        who = user.get_username() if user is not None else ""
        with connection.cursor() as cur:
            cur.execute(
                f"""
                INSERT INTO {cls._meta.db_table} (message_id, store_id, vhost, queue, group_key,
                    group_label, action, who, via, at, job_id, outcome, target_exchange,
                    target_routing_key, detail)
                SELECT message_id, id, vhost, source_queue, group_key, group_label, %s, %s, %s,
                       %s, %s, %s, %s, %s, %s
                FROM recovery_message WHERE id = ANY(%s)
                """,
                [
                    action,
                    who,
                    via,
                    timezone.now(),
                    job_id,
                    outcome,
                    exchange,
                    routing_key,
                    detail,
                    ids,
                ],
            )
            return cur.rowcount

    @staticmethod
    def mark_stored(rows):
        """Set ``stored`` on each row: whether its message is still in the store (one query
        for a page), so a page links only to messages that are there."""
        from recovery.models.store import Message

        rows = list(rows)
        ids = {row.store_id for row in rows}
        stored = set(Message.objects.filter(pk__in=ids).values_list("pk", flat=True))
        for row in rows:
            row.stored = row.store_id in stored
        return rows

    @classmethod
    def expire(cls, days=None, now=None, batch=5000):
        """Delete rows older than HISTORY_DAYS, in short transactions; returns how many."""
        days = settings.HISTORY_DAYS if days is None else days
        cutoff = (now or timezone.now()) - timedelta(days=days)
        old = cls.objects.filter(at__lt=cutoff).order_by()
        deleted = 0
        while ids := list(old.values_list("pk", flat=True)[:batch]):
            with transaction.atomic():
                deleted += cls.objects.filter(pk__in=ids).delete()[0]
        return deleted
