"""API helpers: the one API test client (a token, any header) and store rows built in code."""

import datetime
import json

from django.conf import settings
from django.utils import timezone

from recovery.models import ApiToken, AuditEvidence, AuditRun, AuditWindow
from tests import helpers


class ApiClient:
    """The API tests' one client: Django's test client speaking JSON with ``Authorization: Token
    …`` of a fresh token of ``user`` (of ``team``: a team token), of a given raw token, or
    nothing. The fixtures: ``api_as(user)``, a client per
    user; ``api``, anonymous until ``api.as_user(user)`` (tests/conftest.py)."""

    def __init__(self, client, user=None, team=None):
        self.client = client
        self.user = self.token = self.raw_token = None
        if user is not None:
            self.as_user(user, team)

    def as_user(self, user, team=None):
        """From now on, a fresh token of ``user`` (a team token of ``team``: the user acts as
        a member of that team only); returns this client."""
        self.user = user
        self.token, self.raw_token = ApiToken.issue(user, team=team)
        return self

    def with_token(self, raw):
        """From now on, the raw token ``raw`` (one a test issued or spoilt itself)."""
        self.user = self.token = None
        self.raw_token = raw
        return self

    def headers(self, extra=None):
        headers = {"HTTP_AUTHORIZATION": f"Token {self.raw_token}"} if self.raw_token else {}
        for name, value in (extra or {}).items():
            headers["HTTP_" + name.upper().replace("-", "_")] = value
        return headers

    def get(self, path, params=None, headers=None, **query):
        """GET ``path``; its query string is ``params`` (a dict) and ``query`` (keywords)."""
        return self.client.get(path, {**(params or {}), **query}, **self.headers(headers))

    def post(self, path, data=None, headers=None):
        return self.client.post(
            path, data or {}, content_type="application/json", **self.headers(headers)
        )

    def request(self, method, path, data=None, headers=None):
        if method == "GET":
            return self.get(path, data, headers)
        if method in ("PUT", "PATCH", "DELETE"):
            send = getattr(self.client, method.lower())
            body = json.dumps(data) if data is not None else ""
            return send(path, body, content_type="application/json", **self.headers(headers))
        return self.post(path, data, headers)


def make_message(**fields):
    """An API test's message (``tests.helpers.make_message``): on the session's vhost (replays
    must never reach another), from queue ``app.q`` through the default exchange, group g1."""
    return helpers.make_message(
        **{
            "vhost": settings.RECOVERY_VHOSTS[0],
            "source_queue": "app.q",
            "source_exchange": "",
            "routing_keys": [],
            "death_count": 0,
            "group_key": "g1",
            "group_label": "app.q · rejected",
            **fields,
        }
    )


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
