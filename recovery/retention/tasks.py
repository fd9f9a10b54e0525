"""Retention's Celery task (autodiscovered by console/celery.py), run hourly by beat."""

from celery import shared_task

from recovery.old_task_names import formerly
from recovery.retention import run


@shared_task(name="recovery.retention.tasks.apply_retention", ignore_result=True)
@formerly("recovery.models.tasks.apply_retention", ignore_result=True)
@formerly("recovery.tasks.apply_retention", ignore_result=True)
def apply_retention():
    """Replayed and discarded messages past RETENTION_DAYS leave the store
    (``recovery.retention.run``)."""
    return run.apply_retention()
