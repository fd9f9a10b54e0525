"""Fixtures of the console tests (a logged-in client, fast password hashing, job tasks)."""

import pytest

from tests.helpers import point_celery_at


@pytest.fixture
def logged_in(client):
    """``logged_in(user)`` -> the test client, logged in as that user."""

    def login(user):
        client.force_login(user)
        return client

    return login


@pytest.fixture
def job_tasks(test_vhost):
    """Jobs' Celery tasks go to this session's vhost; ``run(job)`` runs one to its end here.

    Running the task function in the test (instead of a worker) keeps the test in control of
    when the job moves; the job still runs through the real JobRunner on the real broker.
    """
    from django.conf import settings

    from console.celery import app
    from recovery.replay.tasks import run_replay_job

    original = app.conf.broker_url
    point_celery_at(settings.RABBITMQ_URL)

    def run(job):
        job.refresh_from_db()
        outcome = run_replay_job(job.pk, str(job.token))
        job.refresh_from_db()
        return outcome

    yield run
    point_celery_at(original)
