"""Counted twice: the broker's own tally of what it dead-lettered or dropped, set against what
Lazarus stored in the same interval (recovery/broker/tally.py records one row per sample)."""

from django.db import models
from django.utils import timezone


class BrokerTally(models.Model):
    """One sample of the broker's global counters (rabbitmq_prometheus) and, since the previous
    good sample, what they say happened against what the store got.

    ``gap = dead_lettered - stored_dead_letters - backlog_change``: dead letters the broker says
    it sent to a dead-letter exchange that Lazarus neither stored nor holds in its queues.
    ``discarded`` (dead-lettered with no dead-letter exchange, strategy ``disabled``) and
    ``unroutable_dropped`` are gone for good the moment they happen. A sample whose counters
    could not be read keeps ``error`` and no figures: the interval is shown as unknown."""

    taken_at = models.DateTimeField(default=timezone.now, db_index=True)
    # Seconds since the previous good sample (None: the first one, a baseline).
    interval_seconds = models.FloatField(null=True, blank=True)
    # Raw cumulative counters {node url: {series: value}}: the next sample's baseline.
    counters = models.JSONField(default=dict, blank=True)
    error = models.TextField(blank=True, default="")
    dead_lettered = models.BigIntegerField(null=True, blank=True)
    discarded = models.BigIntegerField(null=True, blank=True)
    unroutable_dropped = models.BigIntegerField(null=True, blank=True)
    unroutable_returned = models.BigIntegerField(null=True, blank=True)
    stored_dead_letters = models.BigIntegerField(null=True, blank=True)
    stored_unroutable = models.BigIntegerField(null=True, blank=True)
    # Messages waiting in (or quarantined from) the recovery dead-letter queues at the sample.
    backlog = models.BigIntegerField(null=True, blank=True)
    backlog_change = models.BigIntegerField(null=True, blank=True)
    gap = models.BigIntegerField(null=True, blank=True)
    # {kind:reason: stored rows collected after taken_at - SETTLE_S, visible at this sample}:
    # what the next sample subtracts (recovery/broker/tally.py).
    stored_base = models.JSONField(default=dict, blank=True)
    # {reason: {"broker": n, "discarded": n, "stored": n}}
    by_reason = models.JSONField(default=dict, blank=True)
    # Nodes whose counters went back (a restart): counted from zero for this interval.
    resets = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["-taken_at", "-id"]

    def __str__(self):
        return f"tally {self.taken_at:%Y-%m-%d %H:%M:%S} gap={self.gap} discarded={self.discarded}"

    @property
    def lost(self):
        """Gone for good in this interval, by the broker's own count."""
        if self.discarded is None:
            return None
        return self.discarded + (self.unroutable_dropped or 0)
