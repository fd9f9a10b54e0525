"""The Lazarus side of the client library's outbox: move given-up messages on to the collector.

A ReliablePublisher that cannot reach the broker writes its give-ups to ``recovery_outbox`` in
Lazarus's database (``outbox_dsn``). This task, run by Celery beat, forwards them with confirms
to the returns queue, where the collector stores them as ``unconfirmed``/``nacked``/``returned``.
"""

from celery import shared_task
from django.conf import settings

from recovery import db
from recovery.broker.connection import node_urls
from recovery.client import forward_outbox
from recovery.db import database_conninfo
from recovery.old_task_names import formerly


def outbox_exists(conninfo):
    with db.connect(conninfo) as conn:
        return conn.execute("SELECT to_regclass('recovery_outbox') IS NOT NULL").fetchone()[0]


@shared_task(name="recovery.collector.tasks.forward_client_outbox")
@formerly("recovery.outbox_tasks.forward_client_outbox")
def forward_client_outbox():
    """Forward unforwarded outbox rows; returns how many moved (0 while no producer uses one).

    The table is the client library's to create: until a producer has written to it there is
    nothing to forward, and Lazarus does not create it behind the producers' back.
    """
    conninfo = database_conninfo("lazarus-outbox")
    if not outbox_exists(conninfo):
        return 0
    return forward_outbox(conninfo, node_urls(), returns_queue=settings.RECOVERY_RETURNS_QUEUE)
