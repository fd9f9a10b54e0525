"""Celery tasks of the search indexer (recovery.search.index), driven by Celery beat."""

from celery import shared_task

from recovery.search import index as search_index


@shared_task(name="recovery.search_tasks.index_new_messages", ignore_result=True)
def index_new_messages():
    return search_index.index_new()


@shared_task(name="recovery.search_tasks.sweep_search_index", ignore_result=True)
def sweep_search_index():
    return search_index.sweep()
