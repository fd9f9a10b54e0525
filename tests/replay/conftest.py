"""Replay engine fixtures: stored messages written like the collector writes them, application
queues in the session's vhost, consumers that count (or reject) what arrives, and a Celery app
pointed at the session's vhost (so a job's task never lands in a queue other sessions read).

Every replay test is transactional (``django_db(transaction=True)``): the job runner writes
through its own database connection, which must see committed rows.
"""

import pytest

from recovery.broker.management import Management
from tests.helpers import (
    WorkerProcess,
    declare_app_queue,  # noqa: F401 - the replay tests' import
)
from tests.helpers.replay import Consumer


@pytest.fixture(autouse=True)
def tasks_on_test_vhost(celery_on_test_vhost):
    """Every replay test: create_job/resume enqueue their Celery task on this session's vhost."""


@pytest.fixture
def consumers():
    started = []

    def start(queue, reject=False):
        consumer = Consumer(queue, reject)
        consumer.start()
        consumer.ready.wait(10)
        started.append(consumer)
        return consumer

    yield start
    for consumer in started:
        consumer.stop()


@pytest.fixture(scope="session")
def management():
    return Management()


@pytest.fixture
def workers(tmp_path, wired):
    """Start Celery processes: ``workers(beat=False, **env)``; all are stopped at the end."""
    started = []

    def start(beat=False, **env):
        worker = WorkerProcess.tasks(tmp_path / f"celery{len(started)}.log", beat, **env).start()
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()
