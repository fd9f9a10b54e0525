"""Helpers for the console tests: stored messages made directly in the database."""

import itertools
import uuid

import pytest
from django.utils import timezone

from recovery.models import Message
from tests.conftest import point_celery_at

_serial = itertools.count(1)


def make_message(**fields):
    """A stored message as the collector would have written it (defaults: a rejected order)."""
    n = next(_serial)
    body = fields.pop("body", f'{{"order": {n}}}'.encode())
    queue = fields.get("source_queue", "orders")
    reason = fields.get("reason", "rejected")
    defaults = {
        "kind": "dead_letter",
        "vhost": "/",
        "source_queue": queue,
        "source_exchange": "shop",
        "routing_keys": [queue],
        "reason": reason,
        "death_count": 1,
        "message_id": f"msg-{n}",
        "correlation_id": f"corr-{n}",
        "properties": {"delivery_mode": 2, "content_type": "application/json"},
        "headers": {},
        "body": body,
        "body_size": len(body),
        "content_type": "application/json",
        "fingerprint": uuid.uuid4().hex,
        "group_key": f"group-{queue}-{reason}",
        "group_label": f"{queue} · {reason}",
        "collected_at": timezone.now(),
    }
    defaults.update(fields)
    if "properties" not in fields:
        # As the collector stores them: the ids are properties too (a replay sends them).
        defaults["properties"] = {
            **defaults["properties"],
            "message_id": defaults["message_id"],
            "correlation_id": defaults["correlation_id"],
        }
    return Message.objects.create(**defaults)


@pytest.fixture
def logged_in(client):
    """``logged_in(user)`` -> the test client, logged in as that user."""

    def login(user):
        client.force_login(user)
        return client

    return login


@pytest.fixture(autouse=True)
def fast_password_hashing(settings):
    """PBKDF2's real cost (about a second per user) adds nothing to these tests."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


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
