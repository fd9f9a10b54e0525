"""The broker's Celery task: one tally sample a beat tick. This module sits on the domains floor
(tests/test_layers.py), above the rest of recovery/broker/, because it writes the sample."""

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from recovery.broker import tally
from recovery.models import BrokerTally
from recovery.old_task_names import formerly


def take_sample(now=None, management=None):
    """Read the broker's counters and its recovery queues' backlog, and set them against the
    store and the previous good sample; counters that cannot be read make an unknown sample."""
    now = now or timezone.now()
    try:
        counters = tally.scrape()
        waiting = tally.backlog(management)
    except Exception as exc:  # noqa: BLE001 - an unknown interval is recorded and shown
        return BrokerTally.objects.unreadable(now, exc)
    return BrokerTally.objects.record(now, counters, waiting)


@shared_task(name="recovery.broker.tasks.record_tally")
@formerly("recovery.broker_tasks.record_tally")
def record_tally():
    """One sample of the broker's dead-letter counters against the store (and old samples
    pruned); returns the interval's figures, or its error."""
    sample = take_sample()
    BrokerTally.objects.prune(settings.BROKER_TALLY_KEEP_DAYS)
    if sample.error:
        return {"error": sample.error}
    return {"gap": sample.gap, "discarded": sample.discarded, "dropped": sample.unroutable_dropped}
