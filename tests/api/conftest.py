"""API test helpers: a token client that can send any header, and store rows built in code."""

import datetime

import pytest
from django.conf import settings
from django.utils import timezone

from recovery.models import ApiToken, AuditEvidence, AuditRun, AuditWindow, Message
from tests.conftest import make_user, point_celery_at


class ApiClient:
    """Django's test client speaking JSON with ``Authorization: Token …`` (or nothing)."""

    def __init__(self, client, user=None):
        self.client = client
        self.user = user
        self.raw_token = None
        if user is not None:
            self.token, self.raw_token = ApiToken.issue(user)

    def headers(self, extra=None):
        headers = {"HTTP_AUTHORIZATION": f"Token {self.raw_token}"} if self.raw_token else {}
        for name, value in (extra or {}).items():
            headers["HTTP_" + name.upper().replace("-", "_")] = value
        return headers

    def get(self, path, params=None, headers=None):
        return self.client.get(path, params or {}, **self.headers(headers))

    def post(self, path, data=None, headers=None):
        return self.client.post(
            path, data or {}, content_type="application/json", **self.headers(headers)
        )

    def request(self, method, path, data=None, headers=None):
        if method == "GET":
            return self.get(path, data, headers)
        return self.post(path, data, headers)


@pytest.fixture(autouse=True)
def fast_password_hashing(settings):
    # Personas get passwords; PBKDF2 would spend most of this suite hashing them.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def api_as(client):
    """``api_as(user)`` -> a client with a fresh token of that user; ``api_as(None)`` anonymous."""
    return lambda user: ApiClient(client, user)


@pytest.fixture
def nobody(db):
    return make_user("nils", None)


_counter = iter(range(1_000_000))


def make_message(**fields):
    n = next(_counter)
    defaults = {
        # The session's vhost once `wired` ran (replays must never reach another vhost).
        "vhost": settings.RECOVERY_VHOSTS[0],
        "kind": "dead_letter",
        "source_queue": "app.q",
        "reason": "rejected",
        "body": b'{"n": %d}' % n,
        "body_size": len(b'{"n": %d}' % n),
        "fingerprint": f"api-fp-{n}",
        "group_key": "g1",
        "group_label": "app.q · rejected",
        "message_id": f"mid-{n}",
        "properties": {"message_id": f"mid-{n}", "content_type": "application/json"},
        "content_type": "application/json",
    }
    return Message.objects.create(**{**defaults, **fields})


def make_audit(date=datetime.date(2026, 11, 20), revision=1):
    run = AuditRun.objects.create(
        date=date,
        revision=revision,
        status=AuditRun.State.SUCCEEDED,
        finality="FINAL",
        finished_at=timezone.now(),
        totals={"status": "FINAL", "distinct_published": 10, "publish_attempts": 12, "lost": 1},
        manifest={"files": [], "bytes": 0, "rows": {}},
    )
    start = datetime.datetime.combine(date, datetime.time(3), tzinfo=datetime.UTC)
    AuditWindow.objects.create(
        run=run,
        window_start=start,
        exchange="orders",
        consumer_group="billing",
        status="FINAL",
        metrics={"distinct_published": 10, "publish_attempts": 12, "lost": 1, "loss_ppm": 1e5},
    )
    AuditEvidence.objects.create(
        run=run, kind="lost", window_start=start, exchange="orders", message_id="m-lost"
    )
    return run


@pytest.fixture
def celery_on_test_vhost(test_vhost):
    """Jobs enqueue a Celery task when created: send it to this session's vhost, where no
    worker of another session can pick it up. The test runs the task itself."""
    from console.celery import app

    original = app.conf.broker_url
    point_celery_at(settings.RABBITMQ_URL)
    yield
    point_celery_at(original)
