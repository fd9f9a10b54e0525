"""Celery tasks of the search indexer (recovery.search.index), driven by Celery beat."""

import logging

from celery import shared_task
from django.conf import settings

from recovery.broker.topology import Names, queue_depths
from recovery.old_task_names import formerly
from recovery.search import index as search_index

log = logging.getLogger(__name__)


@shared_task(name="recovery.search.tasks.index_new_messages", ignore_result=True)
@formerly("recovery.search_tasks.index_new_messages", ignore_result=True)
def index_new_messages():
    """Index what was stored since the last run, unless a flood is being collected (then the
    collector gets the cores, for a bounded time: ``search_index.deferred``)."""
    backlog = collector_backlog()
    lag = search_index.deferred(backlog)
    if lag is not None:
        log.info(
            "search index waits for the collector: %d messages in the recovery queues, "
            "index %.0f s behind",
            backlog,
            lag,
        )
        return 0
    return search_index.index_new()


def collector_backlog():
    """Messages waiting in the recovery queues of every watched vhost; 0 if it cannot see them
    (then the indexer runs as usual)."""
    names = Names.from_settings()
    total = 0
    for vhost in settings.RECOVERY_VHOSTS:
        try:
            depths = queue_depths(vhost, names)
        except Exception:  # noqa: BLE001 - the broker down: nothing to make room for
            return 0
        total += sum(depths.get(queue) or 0 for queue in names.source_queues)
    return total


@shared_task(name="recovery.search.tasks.sweep_search_index", ignore_result=True)
@formerly("recovery.search_tasks.sweep_search_index", ignore_result=True)
def sweep_search_index():
    return search_index.sweep()
