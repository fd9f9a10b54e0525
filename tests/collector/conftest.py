"""Helpers for the collector tests: real broker, real database, real collector threads/workers.

Everything runs in this session's vhost (``test_vhost`` from tests/conftest.py) or in a second
private vhost created here; the shared services are never restarted except by the one test
marked ``disruptive``.
"""

import io
import urllib.parse

import pytest
from django.conf import settings
from django.core.management import call_command

from recovery.broker.management import Management
from tests.helpers import (
    WorkerProcess,
    declare_app_queue,  # noqa: F401 - the collector tests' import
    publish,  # noqa: F401 - the collector tests' import
)


@pytest.fixture
def worker_process(transactional_db, wired, clean_queues, tmp_path):
    """Factory for collector worker processes; every one started is stopped at the end."""
    started = []

    def make(vhosts=None, database_url_=None, **env):
        if database_url_:
            env["DATABASE_URL"] = database_url_
        worker = WorkerProcess.collector(
            tmp_path / f"worker{len(started)}.log", vhosts or [wired], **env
        )
        started.append(worker)
        return worker

    yield make
    for worker in started:
        worker.stop()


@pytest.fixture
def second_vhost(wired):
    """A second private vhost, wired with ``manage.py wire --vhost``; deleted afterwards."""
    vhost = f"{wired}-b"
    management = Management()
    management.put_vhost(vhost)
    management.grant(vhost, urllib.parse.urlparse(settings.RABBITMQ_URL).username or "guest")
    try:
        out = io.StringIO()
        call_command("wire", "--vhost", vhost, stdout=out)
        assert f"vhost {vhost}: declared" in out.getvalue()
        assert "; policy lazarus-recovery-queues on the recovery queues" in out.getvalue()
        yield vhost
    finally:
        management.delete_vhost(vhost)
