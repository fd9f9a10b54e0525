"""A team's replay job (#31) sends only what is in its team's scope when it runs: messages
re-scoped since it was made are left out, counted in the activity log, and stay pending."""

import pytest

from recovery.models import Activity, Membership, Message, Scope, Status, Team, TeamScope
from recovery.replay.jobs import create_job
from tests.helpers import declare_app_queue, make_user
from tests.helpers.replay import consume_until_idle, dead_letters, run

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_team_job_leaves_out_what_left_the_scope_before_it_ran(wired, amqp):
    declare_app_queue(amqp, "teamjob.cards")
    # The target stays in the narrowed scope: a target outside it is refused when the job
    # runs too (tests/replay/test_replay_scope.py).
    declare_app_queue(amqp, "teamjob.cards.eu")
    payments = Team.objects.create(name="payments")
    scope = TeamScope.objects.create(team=payments, vhost=wired, queue_pattern="teamjob.*")
    operator = make_user("team-operator", None)
    Membership.objects.create(user=operator, team=payments, role="operator")
    messages = dead_letters("teamjob.cards", 4)
    job = create_job(
        operator,
        message_ids=[m.pk for m in messages],
        target_queue="teamjob.cards.eu",
        scope=Scope.of(operator),
    )
    assert job.team == payments
    # Before it runs, an admin narrows the team's scope: only two of them are still in it.
    scope.queue_pattern = "teamjob.cards.eu"
    scope.save()
    moved = [m.pk for m in messages[:2]]
    Message.objects.filter(pk__in=moved).update(source_queue="teamjob.cards.eu")

    assert run(job) == "done"
    assert job.total == 2 and job.confirmed == 2
    assert len(consume_until_idle("teamjob.cards.eu")) == 2
    left_out = Activity.objects.get(job=job, action="job_out_of_scope")
    assert left_out.detail == {"left_out": 2, "team": payments.pk}
    assert set(Message.objects.filter(pk__in=moved).values_list("status", flat=True)) == {
        Status.REPLAYED
    }
    remaining = Message.objects.filter(pk__in=[m.pk for m in messages[2:]])
    assert set(remaining.values_list("status", flat=True)) == {Status.PENDING}
