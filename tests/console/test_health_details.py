"""/healthz and /readyz (#46): every caller gets up or down; the details (collector errors that
can quote any team's row, the migration count, error texts) only a global admin and
MONITORING_TOKEN."""

import pytest

from recovery.models import ApiToken, Membership, Team, TeamScope
from tests.helpers import make_user, token_for

pytestmark = pytest.mark.django_db

MONITORING = "h" * 40
DOWN = "amqp://guest:guest@127.0.0.1:1/%2F"
STATUS_ONLY = {
    "ok": False,
    "database": {"ok": True},
    "migrations": {"ok": True},
    "broker": {"ok": False},
}


@pytest.fixture
def callers(db, settings):
    """Everyone who is not told the details, as request headers and a login."""
    settings.MONITORING_TOKEN = MONITORING
    team = Team.objects.create(name="health-b")
    TeamScope.objects.create(team=team, vhost="/", queue_pattern="b.*")
    member = make_user("health-b-operator", None)
    Membership.objects.create(user=member, team=team, role="operator")
    admin = make_user("health-admin-in-team", "admin")
    Membership.objects.create(user=admin, team=team, role="viewer")
    tokens = {
        "a user without a role": token_for(make_user("health-nobody", None)),
        "a global viewer": token_for(make_user("health-viewer", "viewer")),
        "a global operator": token_for(make_user("health-operator", "operator")),
        "a team member": token_for(member),
        "a team token": ApiToken.issue(member, team=team)[1],
        "an admin's token acting as a team": ApiToken.issue(admin, team=team)[1],
        "a bad token": "lz_nothing",
    }
    return {"tokens": tokens, "member": member}


def test_it_tells_nobody_but_admins_and_monitoring_the_readyz_details(client, settings, callers):
    settings.RABBITMQ_URL = DOWN
    assert client.get("/readyz").json() == STATUS_ONLY
    for who, raw in callers["tokens"].items():
        response = client.get("/readyz", HTTP_AUTHORIZATION=f"Token {raw}")
        assert (response.status_code, response.json()) == (503, STATUS_ONLY), who
    for user in (callers["member"], make_user("health-viewer-login", "viewer")):
        client.force_login(user)
        assert client.get("/readyz").json() == STATUS_ONLY, user
    client.logout()
    detailed = {
        **STATUS_ONLY,
        "migrations": {"ok": True, "unapplied": 0},
        "broker": {"ok": False, "error": "AMQPConnectionError"},
    }
    assert client.get("/readyz", HTTP_AUTHORIZATION=f"Token {MONITORING}").json() == detailed
    admin = make_user("health-admin", "admin")
    assert client.get("/readyz", HTTP_AUTHORIZATION=f"Token {token_for(admin)}").json() == detailed
    client.force_login(admin)
    assert client.get("/readyz").json() == detailed


def test_it_tells_nobody_but_admins_and_monitoring_the_healthz_details(client, settings, callers):
    settings.RABBITMQ_URL = DOWN
    status_only = {
        "ok": False,
        "database": {"ok": True},
        "broker": {"ok": False},
        "detail": "The details are for global admins and MONITORING_TOKEN.",
    }
    for who, raw in callers["tokens"].items():
        response = client.get("/healthz", HTTP_AUTHORIZATION=f"Token {raw}")
        assert (response.status_code, response.json()) == (503, status_only), who
    client.force_login(callers["member"])
    assert client.get("/healthz").json() == status_only
    client.logout()
    for headers in ({"HTTP_AUTHORIZATION": f"Token {MONITORING}"}, {}):
        if not headers:
            client.force_login(make_user("health-admin", "admin"))
        report = client.get("/healthz", **headers).json()
        assert set(report) == {"database", "broker", "collector", "search_index"}
        assert report["broker"]["ok"] is False and report["broker"]["error"]
