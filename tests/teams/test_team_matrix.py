"""The cross-team matrix (#31): every console URL pattern (walked from Django's resolver) and
every API operation (from the OpenAPI schema drf-spectacular generates) is called by team B's
user and by team B's tokens (user and team: on every console route as well as every API
operation, #46), with URL parameters filled with team A's objects. None of team A's
message ids, queue names, bodies, rule or channel names may come back, and every write must be
refused and change nothing of A's.

No list of routes is kept here: a route added later is called too. Only how to fill a URL
parameter, by its name, is written down (``PARAMETERS``); a parameter it does not know fails
the test, so a new route is never skipped silently.
"""

import datetime
import json
import re

import pytest
from django.db import connection
from django.test import Client
from django.urls import resolve
from drf_spectacular.generators import SchemaGenerator

from recovery.models import (
    Activity,
    AlertRule,
    ApiToken,
    AuditEvidence,
    AuditInputGap,
    AuditRun,
    AuditWindow,
    Membership,
    Message,
    NotificationChannel,
    ReplayJob,
    Team,
    TeamScope,
)
from tests.helpers import make_message, make_user
from tests.helpers.teams import A_BASE, A_GROUP, A_IDS, SHARED_RUN, console_urls, fill_url

A_QUEUE = "payments.cards"
A_EXCHANGE = "payments"
A_SECRETS = [
    "payments.cards",
    "4111-SECRET-PAN",
    "msg-team-a-",
    "a-rule-watch",
    "a-channel",
    "a-audit-error",
    "payments-ledger",
]
B_QUEUE = "search.index"
# What a write sends: every field name the console's forms and the API's requests use,
# pointing at A's messages, queue and group.
WRITE_FIELDS = {
    "ids": ",".join(map(str, A_IDS)),
    "message_ids": A_IDS,
    "action": "discard",
    "reason": "team B was here",
    "exchange": A_EXCHANGE,
    "filters": {"exchange": A_EXCHANGE},
    "group_key": A_GROUP,
    "name": "b-renamed",
    "role": "operator",
    "enabled": False,
    "target_queue": B_QUEUE,
    "until": "",
}
SEQUENCES = [
    "recovery_message",
    "recovery_replayjob",
    "recovery_alertrule",
    "recovery_notificationchannel",
    "recovery_team",
    "recovery_teamscope",
    "recovery_membership",
    "recovery_apitoken",
    "auth_user",
]


def _move_sequences(to):
    with connection.cursor() as cur:
        for table in SEQUENCES:
            cur.execute(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), %s)", [to])


@pytest.fixture
def teams(db):
    # Team B first, with low ids.
    team_b = Team.objects.create(name="search")
    TeamScope.objects.create(team=team_b, vhost="/", queue_pattern="search.*")
    b_user = make_user("b-operator", None)
    Membership.objects.create(user=b_user, team=team_b, role="operator")
    b_message = make_message(source_queue=B_QUEUE, source_exchange="search", body=b'{"q": 1}')
    b_tokens = {
        "b-user-token": ApiToken.issue(b_user)[1],
        "b-team-token": ApiToken.issue(b_user, team=team_b)[1],
    }
    # Team A, every object with an id from A_BASE on.
    _move_sequences(A_BASE)
    team_a = Team.objects.create(name="payments")
    TeamScope.objects.create(
        team=team_a, vhost="/", queue_pattern="payments.*", exchange_pattern=A_EXCHANGE
    )
    a_user = make_user("a-operator-user", None)
    Membership.objects.create(user=a_user, team=team_a, role="operator")
    a_messages = [
        make_message(
            source_queue=A_QUEUE,
            source_exchange=A_EXCHANGE,
            message_id=f"msg-team-a-{i}",
            group_key=A_GROUP,
            body=b'{"card": "4111-SECRET-PAN"}',
            status=status,
        )
        for i, status in enumerate(["pending", "replayed", "discarded"])
    ]
    ReplayJob.objects.create(
        created_by=a_user,
        team=team_a,
        message_ids=[m.pk for m in a_messages],
        allowed_statuses=["pending"],
        state="paused",
        total=3,
    )
    channel = NotificationChannel.objects.create(
        name="a-channel", kind="webhook", target="http://a.example/hook", team=team_a
    )
    rule = AlertRule.objects.create(
        name="a-rule-watch", kind="open_messages", vhost="/", queue=A_QUEUE, team=team_a
    )
    rule.channels.add(channel)
    _audit_of_a()
    return {
        "a_user": a_user,
        "b_user": b_user,
        "b_message": b_message,
        "b_tokens": b_tokens,
        "a": a_messages,
    }


def _audit_of_a():
    """A run whose every window, gap and piece of evidence is A's (exchange, consumer group),
    and whose run-wide error, totals (a figure equal to one of A's ids) and manifest name
    them."""
    run = AuditRun.objects.create(
        pk=SHARED_RUN,
        date=datetime.date(2026, 11, 20),
        status=AuditRun.State.FAILED,
        error="a-audit-error in payments-ledger",
        totals={"distinct_published": 7_300_001},
        manifest={"files": ["payments-ledger.jsonl"]},
    )
    start = datetime.datetime(2026, 11, 20, 3, tzinfo=datetime.UTC)
    AuditWindow.objects.create(
        run=run,
        window_start=start,
        exchange=A_EXCHANGE,
        consumer_group="payments-ledger",
        status="FINAL",
        metrics={"lost": 1},
    )
    AuditEvidence.objects.create(
        run=run,
        kind="lost",
        window_start=start,
        exchange=A_EXCHANGE,
        consumer_group="payments-ledger",
        message_id="msg-team-a-lost",
    )
    AuditInputGap.objects.create(
        run=run, hour=start, side="consumer", process="p1", consumer_group="payments-ledger"
    )


def _snapshot():
    """Everything of A's a write could change."""
    return {
        "messages": list(
            Message.objects.filter(pk__in=A_IDS)
            .order_by("pk")
            .values_list("pk", "status", "replay_count", "discarded_at", "status_reason")
        ),
        "jobs": list(ReplayJob.objects.order_by("pk").values_list("pk", "state", "team_id")),
        "rules": list(AlertRule.objects.order_by("pk").values()),
        "channels": list(NotificationChannel.objects.order_by("pk").values()),
        "teams": list(Team.objects.order_by("pk").values()),
        "scopes": list(TeamScope.objects.order_by("pk").values()),
        "members": list(Membership.objects.order_by("pk").values()),
        "activity_on_a": Activity.objects.filter(message_id__in=A_IDS).count(),
    }


def api_operations():
    schema = SchemaGenerator().get_schema(request=None, public=True)
    return [
        (method.upper(), url)
        for path, operations in schema["paths"].items()
        for method in operations
        for url in fill_url(path, r"\{(\w+)\}")
    ]


def _leaks(response, path):
    # An error names the URL asked for (problem+json ``instance``): that is no leak.
    text = response.content.decode(errors="replace").replace(path, "")
    found = [secret for secret in A_SECRETS if secret in text]
    found += [str(pk) for pk in A_IDS if str(pk) in text]
    return found


def _refused(response):
    """403/404/405, or (Django's admin, for non-staff) a redirect to its login."""
    if response.status_code == 302:
        return "/login/" in response["Location"]
    return response.status_code in (403, 404, 405)


def _check_get(response, who, url):
    assert response.status_code < 500, f"{who} GET {url}: {response.status_code}"
    assert not _leaks(response, url), f"{who} GET {url} shows {_leaks(response, url)}"


# Searches that would find A's messages (never a whole secret: a page echoes its filters).
SEARCHES = {"exchange": A_EXCHANGE, "q": "SECRET-PAN", "group": A_GROUP}


# Slow: every console route and API operation with each of B's credentials (about a minute
# here), in make test; the quick loop keeps the teams package's per-feature scope tests.
@pytest.mark.slow
def test_team_b_sees_and_changes_nothing_of_team_a(teams, settings):
    settings.CELERY_TASK_ALWAYS_EAGER = False
    before = _snapshot()
    urls = console_urls()
    operations = api_operations()
    # The walk really is every route: the message pages, the admin site, the API itself.
    assert any(u.startswith("messages/") for u in urls) and any("admin/" in u for u in urls)
    assert len({url for _m, url in operations}) > 30

    session = Client()
    for url in urls:
        path = "/" + url
        resolve(path)  # a filled pattern that does not resolve is a bug in the filling
        session.force_login(teams["b_user"])
        _check_get(session.get(path), "B's session", path)
        session.force_login(teams["b_user"])
        _check_get(session.get(path, SEARCHES), "B's session", path)
        if re.search(r"<|\d{7}", url) or str(A_BASE) in path:
            session.force_login(teams["b_user"])
            refused = session.post(path, WRITE_FIELDS_FORM)
            assert _refused(refused), f"B's session POST {path}: {refused.status_code}"
        else:
            session.force_login(teams["b_user"])
            session.post(path, WRITE_FIELDS_FORM)

    for who, raw in teams["b_tokens"].items():
        _console_with_token(urls, who, raw)
        api = Client(HTTP_AUTHORIZATION=f"Token {raw}")
        for method, path in operations:
            if method == "GET":
                _check_get(api.get(path), who, path)
                _check_get(api.get(path, SEARCHES), who, path)
                continue
            response = api.generic(
                method, path, json.dumps(WRITE_FIELDS), content_type="application/json"
            )
            assert response.status_code < 500, f"{who} {method} {path}: {response.status_code}"
            if str(A_BASE) in path:
                assert _refused(response), f"{who} {method} {path}: {response.status_code}"
            leaked = _leaks(response, path)
            assert not leaked, f"{who} {method} {path} shows {leaked}"

    assert _snapshot() == before
    # B's own message was there to be seen all along (the pages were not simply empty).
    session.force_login(teams["b_user"])
    assert B_QUEUE in session.get("/messages/").content.decode()
    # And A's member does see A's: the pages above were scoped, not blank.
    session.force_login(teams["a_user"])
    for path in (
        "/messages/",
        "/alerts/",
        "/jobs/",
        f"/messages/{A_IDS[0]}/",
        f"/audits/{SHARED_RUN}/",
        f"/audits/{SHARED_RUN}/evidence",
    ):
        assert _leaks(session.get(path), path), path


def _console_with_token(urls, who, raw):
    """#46: every console route with only B's token (no session): console views never act as
    a token's user, and the ones that read a token themselves (/metrics, /healthz, /readyz)
    judge it with its team. Nothing of A's may come back, and no write may land."""
    client = Client(HTTP_AUTHORIZATION=f"Token {raw}")
    for url in urls:
        path = "/" + url
        _check_get(client.get(path), f"{who} (console)", path)
        _check_get(client.get(path, SEARCHES), f"{who} (console)", path)
        response = client.post(path, WRITE_FIELDS_FORM)
        assert response.status_code < 500, f"{who} POST {path}: {response.status_code}"
        assert not _leaks(response, path), f"{who} POST {path} shows {_leaks(response, path)}"
        if str(A_BASE) in path:
            assert _refused(response), f"{who} POST {path}: {response.status_code}"
    # The routes that do read a token refuse B's or tell it up or down only.
    assert client.get("/metrics").status_code == 403
    assert set(client.get("/healthz").json()) == {"ok", "database", "broker", "detail"}
    assert "unapplied" not in client.get("/readyz").json().get("migrations", {})


WRITE_FIELDS_FORM = {
    key: (",".join(map(str, value)) if isinstance(value, list) else value)
    for key, value in WRITE_FIELDS.items()
    if not isinstance(value, dict)
}
