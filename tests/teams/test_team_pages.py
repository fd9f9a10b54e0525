"""What a team member gets from the pages and the API (#31): their own messages, figures,
groups and jobs; 404 for another team's message; everything for users in no team."""

import datetime

import pytest
from django.conf import settings

from recovery.collector.health import without_error_text
from recovery.models import (
    Activity,
    ApiToken,
    AuditRun,
    AuditWindow,
    Membership,
    MessageHistory,
    Role,
    Team,
    TeamScope,
)
from tests.helpers import make_message, make_user
from tests.helpers.api import ApiClient

pytestmark = pytest.mark.django_db


@pytest.fixture
def stores(payments_team, team_viewer):
    mine = [make_message(source_queue="pay.cards") for _ in range(2)]
    theirs = [make_message(source_queue="hr.payroll", body=b"salary") for _ in range(3)]
    return {"team": payments_team, "mine": mine, "theirs": theirs, "payer": team_viewer}


def test_a_member_sees_their_own_figures_and_messages(client, stores):
    client.force_login(stores["payer"])
    overview = client.get("/")
    assert overview.context["total"] == 2 and "hr.payroll" not in overview.content.decode()
    assert "hr.payroll" not in client.get("/groups/").content.decode()
    assert client.get(f"/messages/{stores['theirs'][0].pk}/").status_code == 404
    assert client.get(f"/messages/{stores['theirs'][0].pk}/body").status_code == 404
    assert client.get(f"/messages/{stores['mine'][0].pk}/").status_code == 200
    listed = client.get("/messages/").context["messages_page"]
    assert {m.pk for m in listed} == {m.pk for m in stores["mine"]}


def test_a_viewer_member_cannot_act_even_on_their_own_messages(client, stores):
    client.force_login(stores["payer"])
    assert client.post(f"/messages/{stores['mine'][0].pk}/discard").status_code == 403


def test_a_team_token_reads_its_team_through_the_api(client, stores):
    raw = ApiToken.issue(stores["payer"], team=stores["team"])[1]
    auth = {"HTTP_AUTHORIZATION": f"Token {raw}"}
    listed = client.get("/api/v1/messages", **auth).json()["results"]
    assert {m["id"] for m in listed} == {m.pk for m in stores["mine"]}
    assert client.get("/api/v1/stats", **auth).json()["total"] == 2
    me = client.get("/api/v1/me", **auth).json()
    assert me["team"] == "payments" and me["teams"] == ["payments"] and me["role"] == "viewer"
    assert client.get(f"/api/v1/messages/{stores['theirs'][0].pk}", **auth).status_code == 404
    # Routes not scoped refuse team callers rather than show everything.
    assert client.get("/api/v1/broker", **auth).status_code == 403
    assert client.get("/api/v1/uncovered-queues", **auth).status_code == 403


def test_users_in_no_team_see_everything_as_before(client, stores):
    viewer = make_user("old-viewer", Role.VIEWER)
    client.force_login(viewer)
    assert client.get("/").context["total"] == 5
    assert client.get(f"/messages/{stores['theirs'][0].pk}/").status_code == 200
    assert client.get("/alerts/").status_code == 200


def test_an_admin_makes_a_team_through_the_api(client):
    admin = make_user("root-admin", Role.ADMIN)
    auth = {"HTTP_AUTHORIZATION": f"Token {ApiToken.issue(admin)[1]}"}
    made = client.post("/api/v1/teams", {"name": "search"}, "application/json", **auth).json()
    bad = client.post("/api/v1/team-scopes", {"team": made["id"]}, "application/json", **auth)
    assert bad.status_code == 400
    scope = client.post(
        "/api/v1/team-scopes",
        {"team": made["id"], "queue_pattern": "search.*"},
        "application/json",
        **auth,
    )
    assert scope.status_code == 201
    make_user("indexer", None)
    joined = client.post(
        "/api/v1/team-memberships",
        {"team": made["id"], "user": "indexer", "role": "operator"},
        "application/json",
        **auth,
    )
    assert joined.status_code == 201
    team = client.get(f"/api/v1/teams/{made['id']}", **auth).json()
    assert team["scopes"][0]["queue_pattern"] == "search.*"
    assert team["members"][0]["user"] == "indexer"


def test_a_teams_alert_rule_watches_its_scope_and_notifies_its_channels(client, stores):
    admin = make_user("rule-admin", Role.ADMIN)
    auth = {"HTTP_AUTHORIZATION": f"Token {ApiToken.issue(admin)[1]}"}
    team = stores["team"].pk

    def post(path, body):
        return client.post(path, body, "application/json", **auth)

    theirs = post(
        "/api/v1/alert-channels", {"name": "hr", "kind": "webhook", "target": "http://h/"}
    )
    ours = post(
        "/api/v1/alert-channels",
        {"name": "pay", "kind": "webhook", "target": "http://p/", "team": team},
    )
    # A rule watches a vhost Lazarus watches (the session's test vhost once another test set it).
    vhost = settings.RECOVERY_VHOSTS[0]
    TeamScope.objects.create(team=stores["team"], vhost=vhost, queue_pattern="pay.*")
    rule = {"name": "pay open", "kind": "open_messages", "vhost": vhost, "team": team}
    assert post("/api/v1/alert-rules", {**rule, "queue": "hr.payroll"}).status_code == 400
    assert post("/api/v1/alert-rules", rule).status_code == 400  # no queue: everything
    refused = post(
        "/api/v1/alert-rules",
        {**rule, "queue": "pay.cards", "channels": [theirs.json()["id"]]},
    )
    assert refused.status_code == 400 and "channels" in refused.json()["errors"]
    made = post(
        "/api/v1/alert-rules", {**rule, "queue": "pay.cards", "channels": [ours.json()["id"]]}
    )
    assert made.status_code == 201, made.content
    member = {"HTTP_AUTHORIZATION": f"Token {ApiToken.issue(stores['payer'])[1]}"}
    listed = client.get("/api/v1/alert-rules", **member).json()["results"]
    assert [r["name"] for r in listed] == ["pay open"]
    channels = client.get("/api/v1/alert-channels", **member).json()["results"]
    assert [(c["name"], c["target"]) for c in channels] == [("pay", None)]
    outsider = make_user("outsider", Role.VIEWER)
    client.force_login(outsider)
    assert "pay open" in client.get("/alerts/").content.decode()  # global users see all


def test_the_activity_log_says_which_team_a_token_acted_as(client, stores):
    Membership.objects.filter(user=stores["payer"]).update(role="operator")
    message = stores["mine"][0]
    team_api = ApiClient(client, stores["payer"], team=stores["team"])
    discarded = team_api.post(f"/api/v1/messages/{message.pk}/discard")
    assert discarded.status_code == 200
    entry = Activity.objects.get(action="discard", message=message)
    assert entry.acting_team == stores["team"] and entry.via == "api"
    client.force_login(stores["payer"])
    assert "as team payments" in client.get("/activity/").content.decode()
    # The next request, on the same thread, acts as nobody's team.
    client.post(f"/messages/{stores['mine'][1].pk}/discard")
    assert Activity.objects.get(message=stores["mine"][1]).acting_team is None


def test_an_admin_manages_teams_in_the_console(client):
    client.force_login(make_user("console-admin", Role.ADMIN))
    make_user("carol", None)
    assert client.post("/teams/", {"form": "team", "team-name": "ops"}).status_code == 302
    ops = Team.objects.get(name="ops")
    bad = client.post("/teams/", {"form": "scope", "scope-team": ops.pk, "scope-vhost": "/"})
    assert bad.status_code == 200 and not TeamScope.objects.exists()  # a form error
    scope = {"form": "scope", "scope-team": ops.pk, "scope-vhost": "/"}
    assert client.post("/teams/", {**scope, "scope-queue_pattern": "ops.*"}).status_code == 302
    member = {"form": "member", "member-team": ops.pk, "member-user": "carol"}
    assert client.post("/teams/", {**member, "member-role": "viewer"}).status_code == 302
    page = client.get("/teams/").content.decode()
    assert "ops.*" in page and "carol" in page
    joined = Membership.objects.get(user__username="carol")
    assert client.post(f"/teams/member/{joined.pk}/delete").status_code == 302
    assert client.post("/teams/nothing/1/delete").status_code == 404
    client.force_login(make_user("console-operator", Role.OPERATOR))
    assert client.get("/teams/").status_code == 403


def test_a_team_token_never_gets_back_what_its_user_did_with_the_same_key(client, stores, settings):
    settings.CELERY_TASK_ALWAYS_EAGER = False
    Membership.objects.filter(user=stores["payer"]).update(role="operator")
    as_user = {"HTTP_AUTHORIZATION": f"Token {ApiToken.issue(stores['payer'])[1]}"}
    body = {"message_ids": [stores["mine"][0].pk]}
    key = {"HTTP_IDEMPOTENCY_KEY": "k-1"}
    first = client.post("/api/v1/replay-jobs", body, "application/json", **as_user, **key)
    assert first.status_code == 201
    search = Team.objects.create(name="search")
    Membership.objects.create(user=stores["payer"], team=search, role="operator")
    as_search = {"HTTP_AUTHORIZATION": f"Token {ApiToken.issue(stores['payer'], team=search)[1]}"}
    again = client.post("/api/v1/replay-jobs", body, "application/json", **as_search, **key)
    assert again.status_code == 422  # not the payments job made by the user's own token
    assert again.json()["code"] == "idempotency_key_reused"


def test_a_member_is_told_the_collector_failed_but_not_its_error_text():
    health = {
        "sources": [{"last_error": "Failing row contains (salary 9000)", "errors": 1}],
        "threads": [{"last_error": "", "errors": 0}],
    }
    hidden = without_error_text(health)
    assert hidden["sources"] == [{"last_error": "(hidden)", "errors": 1}]
    assert hidden["threads"] == [{"last_error": "", "errors": 0}]


def test_a_member_sees_the_audit_of_their_exchanges_and_groups_only(client, stores):
    TeamScope.objects.filter(team=stores["team"]).update(exchange_pattern="pay")
    run = AuditRun.objects.create(
        date=datetime.date(2026, 11, 20), status="succeeded", totals={"lost": 5}
    )
    start = datetime.datetime(2026, 11, 20, 3, tzinfo=datetime.UTC)
    for exchange, group, lost in [("pay", "ledger", 0), ("hr", "pay.audit", 0), ("hr", "hr", 5)]:
        AuditWindow.objects.create(
            run=run,
            window_start=start,
            exchange=exchange,
            consumer_group=group,
            status="FINAL",
            metrics={"lost": lost, "unclaimed": 2 if exchange == "pay" else 0},
        )
    team_api = ApiClient(client, stores["payer"], team=stores["team"])
    seen = team_api.get(f"/api/v1/audits/{run.pk}").json()
    assert {(w["exchange"], w["consumer_group"]) for w in seen["windows"]} == {
        ("pay", "ledger"),
        ("hr", "pay.audit"),
    }
    assert seen["totals"] == {}  # the whole broker's
    assert seen["warnings"] == [{"code": "unclaimed", "count": 2}]
    assert seen["outcome"] == "succeeded_with_warnings"  # never a plain success


def test_a_team_sees_its_own_history_and_bodies_and_not_the_broker_wide_pages(
    client, api, team_operator
):
    """History rows and the API's body endpoint are narrowed like the messages; the broker-wide
    pages (broker, quarantine) are not in a team member's menu and refuse them."""

    user = team_operator
    ours = make_message(source_queue="pay.cards", message_id="ours-1", body=b"ours")
    theirs = make_message(source_queue="hr.payroll", message_id="theirs-1", body=b"theirs")
    for message in (ours, theirs):
        MessageHistory.objects.create(
            message_id=message.message_id,
            store_id=message.pk,
            vhost=message.vhost,
            queue=message.source_queue,
            action="discard",
        )
    client.force_login(user)
    page = client.get("/history/").content.decode()
    assert "ours-1" in page and "theirs-1" not in page
    searched = client.get("/history/", {"message_id": "theirs-1"}).content.decode()
    assert ">theirs-1<" not in searched and ">ours-1<" not in searched
    body = api.as_user(user)
    assert body.get(f"/api/v1/messages/{ours.pk}/body").content == b"ours"
    assert body.get(f"/api/v1/messages/{theirs.pk}/body").status_code == 404
    rows = body.get("/api/v1/history").json()["results"]
    assert [r["message_id"] for r in rows] == ["ours-1"]
    menu = client.get("/").content.decode()
    assert 'href="/broker/"' not in menu and 'href="/quarantine/"' not in menu
    assert client.get("/quarantine/").status_code in (403, 404)
