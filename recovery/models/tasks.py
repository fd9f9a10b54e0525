"""Celery tasks keeping the store in shape (autodiscovered by console/celery.py), run by beat
(retention's is recovery/retention/tasks.py).

- ``compact_message_counts``: fold the count triggers' delta rows of MessageCount and
  MessageTotal (1/min). Without it the counts stay right; reading them just gets slower as delta
  rows pile up.
"""

from celery import shared_task

from recovery.models.counts import MessageCount, MessageTotal
from recovery.old_task_names import formerly


@shared_task(name="recovery.models.tasks.compact_message_counts", ignore_result=True)
@formerly("recovery.count_tasks.compact_message_counts", ignore_result=True)
def compact_message_counts():
    return MessageCount.compact() + MessageTotal.compact()
