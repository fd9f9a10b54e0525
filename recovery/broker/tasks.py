from celery import shared_task

from recovery.old_task_names import formerly


@shared_task(name="recovery.broker.tasks.record_tally")
@formerly("recovery.broker_tasks.record_tally")
def record_tally():
    """One sample of the broker's dead-letter counters against the store (and old samples
    pruned); returns the interval's figures, or its error."""
    from django.conf import settings

    from recovery.broker import tally

    sample = tally.record()
    tally.prune(settings.BROKER_TALLY_KEEP_DAYS)
    if sample.error:
        return {"error": sample.error}
    return {"gap": sample.gap, "discarded": sample.discarded, "dropped": sample.unroutable_dropped}
