"""/metrics: the Prometheus text format, read with prometheus-client's own parser."""

import pytest
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from recovery.models import AlertRule, AuditRun, ReplayJob
from tests.helpers import make_message, make_user, token_for

pytestmark = pytest.mark.django_db


def scrape(client, **headers):
    response = client.get("/metrics", **headers)
    assert response.status_code == 200, response.content
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def test_it_is_not_public(client, settings, viewer):
    settings.METRICS_ALLOWED_IPS = []
    denied = client.get("/metrics")
    assert denied.status_code == 401 and denied["WWW-Authenticate"] == "Token"
    assert scrape(client, HTTP_AUTHORIZATION=f"Token {token_for(viewer)}")
    settings.METRICS_ALLOWED_IPS = ["127.0.0.0/8"]  # the test client's address
    assert scrape(client)


def test_it_reports_the_store_jobs_audits_and_alerts(client, settings):
    settings.METRICS_ALLOWED_IPS = ["127.0.0.1"]
    make_message(source_queue="metrics-orders", reason="expired")
    make_message(source_queue="metrics-orders", reason="expired")
    make_message(source_queue="metrics-orders", status="discarded")
    ReplayJob.objects.create(state="paused", confirmed=7)
    AuditRun.objects.create(
        date="2026-11-20",
        status="succeeded",
        finality="FINAL",
        totals={"lost": 3, "dup_msgs": 1, "unverified": 2, "unclaimed": 5},
        warnings=[{"code": "unclaimed", "count": 5}],
    )
    AlertRule.objects.create(
        name="m", kind="audit", state="firing", last_evaluated_at=timezone.now()
    )
    samples = scrape(client)
    labels = (("kind", "dead_letter"), ("reason", "expired"), ("status", "pending"))
    assert samples[("lazarus_messages", labels)] == 2
    assert samples[("lazarus_open_messages", (("queue", "metrics-orders"), ("vhost", "/")))] == 2
    assert samples[("lazarus_replay_jobs", (("state", "paused"),))] == 1
    assert samples[("lazarus_replay_job_messages", (("outcome", "confirmed"),))] == 7
    assert samples[("lazarus_audit_last_final", (("metric", "lost"),))] == 3
    assert samples[("lazarus_audit_last_final_warnings", ())] == 1
    assert samples[("lazarus_alert_rules_firing", ())] == 1


def test_queue_series_are_bounded(client, settings):
    settings.METRICS_ALLOWED_IPS = ["127.0.0.1"]
    settings.METRICS_MAX_QUEUES = 3
    for i in range(6):
        for _ in range(i + 1):
            make_message(source_queue=f"bounded-{i}")
    samples = scrape(client)
    queues = {
        dict(labels)["queue"]: value
        for (name, labels), value in samples.items()
        if name == "lazarus_open_messages"
    }
    assert queues == {"bounded-5": 6, "bounded-4": 5, "bounded-3": 4, "__other__": 3 + 2 + 1}


def test_a_rule_that_cannot_check_is_unknown_not_ok(client, settings):
    settings.METRICS_ALLOWED_IPS = ["127.0.0.1"]
    now = timezone.now()
    blind = AlertRule.objects.create(
        name="blind",
        kind="broker_alarm",
        state="unknown",
        last_known_state="firing",
        last_error="ManagementError: down",
        last_evaluated_at=now,
    )
    fine = AlertRule.objects.create(name="fine", kind="audit", last_evaluated_at=now)
    never = AlertRule.objects.create(name="never", kind="audit")  # beat never looked: unknown
    samples = scrape(client)

    def state_of(rule):
        values = {
            state: samples[
                (
                    "lazarus_alert_rule_state",
                    (
                        ("kind", rule.kind),
                        ("rule", rule.name),
                        ("rule_id", str(rule.pk)),
                        ("state", state),
                    ),
                )
            ]
            for state in ("ok", "firing", "unknown")
        }
        assert sorted(values.values()) == [0, 0, 1], values
        return next(state for state, value in values.items() if value == 1)

    assert (state_of(blind), state_of(fine), state_of(never)) == ("unknown", "ok", "unknown")
    assert samples[("lazarus_alert_rules", (("state", "unknown"),))] == 2
    assert samples[("lazarus_alert_rules", (("state", "ok"),))] == 1
    assert samples[("lazarus_alert_rules", (("state", "firing"),))] == 0
    assert samples[("lazarus_alert_rules_firing", ())] == 0


# ---- who may scrape (#46): every team's series, so global callers only --------------------

MONITORING = "m" * 40


@pytest.fixture
def team_b(db):
    """Team B's operator, a user token of theirs and a token acting as team B, with team A's
    queue in the store (what a scrape would name)."""
    from recovery.models import ApiToken, Membership, Team, TeamScope

    team = Team.objects.create(name="metrics-b")
    TeamScope.objects.create(team=team, vhost="/", queue_pattern="b.*")
    member = make_user("metrics-b-operator", None)
    Membership.objects.create(user=member, team=team, role="operator")
    make_message(source_queue="a.payments.cards")
    return {
        "member": member,
        "user token": ApiToken.issue(member)[1],
        "team token": ApiToken.issue(member, team=team)[1],
        "team": team,
    }


def refused(client, status, **headers):
    response = client.get("/metrics", **headers)
    assert response.status_code == status, response.content
    assert b"a.payments.cards" not in response.content
    return response.content.decode()


def test_it_refuses_a_teams_tokens_and_members_from_anywhere(client, settings, team_b):
    for allowed in ([], ["127.0.0.0/8"]):  # the scraper's network does not widen a team
        settings.METRICS_ALLOWED_IPS = allowed
        for who in ("user token", "team token"):
            text = refused(client, 403, HTTP_AUTHORIZATION=f"Token {team_b[who]}")
            assert text == "metrics cover every team: a team's member or token cannot read them\n"
        client.force_login(team_b["member"])
        refused(client, 403)
        client.logout()


def test_it_refuses_an_admins_token_acting_as_a_team(client, settings, team_b):
    from recovery.models import ApiToken, Membership

    settings.METRICS_ALLOWED_IPS = []
    admin = make_user("metrics-admin", "admin")
    Membership.objects.create(user=admin, team=team_b["team"], role="viewer")
    narrowed = ApiToken.issue(admin, team=team_b["team"])[1]
    refused(client, 403, HTTP_AUTHORIZATION=f"Token {narrowed}")
    full = scrape(client, HTTP_AUTHORIZATION=f"Token {token_for(admin)}")
    assert full[("lazarus_open_messages", (("queue", "a.payments.cards"), ("vhost", "/")))] == 1


def test_it_refuses_a_user_without_a_role_and_a_bad_token(client, settings, db):
    settings.METRICS_ALLOWED_IPS = ["127.0.0.0/8"]
    make_message(source_queue="a.payments.cards")
    nobody = make_user("metrics-nobody", None)
    text = refused(client, 403, HTTP_AUTHORIZATION=f"Token {token_for(nobody)}")
    assert text == "metrics need a role (viewer or better)\n"
    bad = client.get("/metrics", HTTP_AUTHORIZATION="Token lz_not-a-token")
    assert bad.status_code == 401 and bad["WWW-Authenticate"] == "Token"
    assert b"a.payments.cards" not in bad.content


def test_the_monitoring_token_reads_everything_and_nothing_else(client, settings, db):
    settings.METRICS_ALLOWED_IPS = []
    settings.MONITORING_TOKEN = MONITORING
    make_message(source_queue="a.payments.cards")
    samples = scrape(client, HTTP_AUTHORIZATION=f"Token {MONITORING}")
    assert samples[("lazarus_open_messages", (("queue", "a.payments.cards"), ("vhost", "/")))] == 1
    # It is no user's token: pages and the API do not take it.
    assert (
        client.get("/api/v1/messages", HTTP_AUTHORIZATION=f"Token {MONITORING}").status_code == 401
    )
    page = client.get("/messages/", HTTP_AUTHORIZATION=f"Token {MONITORING}")
    assert page.status_code == 302 and page["Location"].startswith("/login/")
    refused(client, 401, HTTP_AUTHORIZATION=f"Token {MONITORING[:-1]}x")
