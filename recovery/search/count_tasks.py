"""Celery task keeping MessageCount and MessageTotal small: fold the triggers' delta rows
(Celery beat, 1/min).

Without it the counts stay right; reading them just gets slower as delta rows pile up.
"""

from celery import shared_task

from recovery.models import MessageCount, MessageTotal


@shared_task(name="recovery.count_tasks.compact_message_counts", ignore_result=True)
def compact_message_counts():
    return MessageCount.compact() + MessageTotal.compact()
