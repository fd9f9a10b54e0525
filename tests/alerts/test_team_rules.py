"""Alert rules and channels across teams (#46 item 4): a team's rule stops watching a queue its
team lost; a global rule notifies global channels only; a channel stays with the team whose
rules (or the global rules) notify it."""

import datetime

import pytest
from django.conf import settings
from django.utils import timezone

from recovery.alerts.engine import evaluate
from recovery.models import (
    AlertRule,
    Notification,
    NotificationChannel,
    Role,
    Team,
    TeamScope,
)
from tests.helpers import make_message, make_user
from tests.helpers.api import ApiClient

pytestmark = pytest.mark.django_db


@pytest.fixture
def payments():
    team = Team.objects.create(name="payments")
    TeamScope.objects.create(team=team, vhost=settings.RECOVERY_VHOSTS[0], queue_pattern="pay.*")
    return team


def channel(name, team=None):
    return NotificationChannel.objects.create(
        name=name, kind="webhook", target=f"http://127.0.0.1:9/{name}", team=team
    )


def test_it_stops_a_team_rule_watching_a_queue_its_team_lost(payments):
    vhost = settings.RECOVERY_VHOSTS[0]
    hook = channel("pay", payments)
    watched = AlertRule.objects.create(
        name="pay open", kind="open_messages", vhost=vhost, queue="pay.cards", team=payments
    )
    watched.channels.set([hook])
    make_message(vhost=vhost, source_queue="pay.cards")
    now = timezone.now()
    assert evaluate(now=now)[watched.pk] == "firing"
    # The queue goes to another team: the rule no longer reads it, and says why.
    TeamScope.objects.filter(team=payments).update(queue_pattern="pay.refunds")
    make_message(vhost=vhost, source_queue="pay.cards")
    evaluate(now=now + datetime.timedelta(seconds=30))
    watched.refresh_from_db()
    assert watched.current_state == "unknown"
    assert watched.last_error == (
        "OutsideTeamScope: outside the team's scopes: edit the rule or the team's scopes"
    )
    assert watched.last_value == 1  # the count of two is never read
    assert Notification.objects.filter(rule=watched, event="firing").count() == 1


def test_it_refuses_a_global_rule_notifying_a_teams_channel(api, client, payments):
    admin = make_user("alerts-admin", Role.ADMIN)
    team_hook = channel("pay", payments)
    rule = {"name": "all open", "kind": "open_messages", "channels": [team_hook.pk]}
    refused = api.as_user(admin).post("/api/v1/alert-rules", rule)
    assert refused.status_code == 400
    assert refused.json()["errors"]["channels"] == ["a global rule notifies only global channels"]
    client.force_login(admin)
    page = client.post(
        "/alerts/",
        {
            "rule-name": "all open",
            "rule-kind": "open_messages",
            "rule-for_seconds": "0",
            "rule-channels": [team_hook.pk],
        },
    )
    assert page.status_code == 200 and not AlertRule.objects.exists()
    assert f'value="{team_hook.pk}"' not in page.content.decode()  # not even offered


def test_it_never_queues_a_global_rules_notification_to_a_teams_channel(payments):
    # Linked before that was refused (or by hand): the outbox still gets only the global one.
    global_hook, team_hook = channel("ops"), channel("pay", payments)
    watched = AlertRule.objects.create(name="all open", kind="open_messages")
    watched.channels.set([global_hook, team_hook])
    make_message(source_queue="hr.payroll")
    assert evaluate(now=timezone.now())[watched.pk] == "firing"
    assert list(Notification.objects.values_list("channel__name", flat=True)) == ["ops"]


def test_it_keeps_a_channel_global_rules_use_out_of_a_team(client, payments):
    admin = make_user("alerts-admin", Role.ADMIN)
    hook = channel("ops")
    AlertRule.objects.create(name="all open", kind="open_messages").channels.set([hook])
    moved = ApiClient(client, admin).request(
        "PATCH", f"/api/v1/alert-channels/{hook.pk}", {"team": payments.pk}
    )
    assert moved.status_code == 400
    assert moved.json()["errors"]["team"] == [
        "rules of another team (or global rules) notify this channel"
    ]
    hook.refresh_from_db()
    assert hook.team_id is None
