"""Where a replay may go, and for whom a job goes on sending (#46): a team member's target lies
in their team's scopes; Lazarus's and the broker's own names are no one's target; names are
checked to AMQP's limits (a 400, never a 503); a delay leads only to an exchange that exists;
what a caller may not read in full goes only to its own target; a job looks at its creator's
rights again while it runs, and counts only within its team's scope."""

import pika
import pytest
from django.core.exceptions import ValidationError
from django.test import Client
from django.urls import reverse

from recovery.errors import StateError
from recovery.models import (
    Activity,
    ApiToken,
    MaskRule,
    Membership,
    Message,
    MessageHistory,
    ReplayJob,
    Scope,
    Status,
    Team,
    TeamScope,
    set_privileges,
)
from recovery.replay.authority import LEFT_SCOPE, NOT_READABLE
from recovery.replay.jobs import create_job, resume_job
from recovery.replay.targets import NEEDS_FULL_READ
from tests.helpers import declare_app_queue, make_message, make_user, wait_for
from tests.helpers.api import ApiClient
from tests.helpers.replay import consume_until_idle, dead_letters, queue_depth, run, run_in_thread

pytestmark = pytest.mark.django_db(transaction=True)

A_QUEUE, A_OTHER, B_QUEUE = "scope-a.orders", "scope-a.debug", "scope-b.index"


@pytest.fixture
def teams(wired, amqp):
    """Team A (queues scope-a.*) with an operator, team B (scope-b.*); their queues declared."""
    for queue in (A_QUEUE, A_OTHER, B_QUEUE):
        declare_app_queue(amqp, queue)
        amqp.queue_purge(queue)
    a = Team.objects.create(name="team-a")
    b = Team.objects.create(name="team-b")
    TeamScope.objects.create(team=a, vhost=wired, queue_pattern="scope-a.*")
    TeamScope.objects.create(team=b, vhost=wired, queue_pattern="scope-b.*")
    operator = make_user("a-operator", None)
    Membership.objects.create(user=operator, team=a, role="operator")
    return a, b, operator


def post(token, path, data):
    return ApiClient(Client()).with_token(token).post(path, data)


def replay(token, message, **target):
    return post(token, f"/api/v1/messages/{message.pk}/replay", target)


# ---- one message ------------------------------------------------------------------------------


def test_it_refuses_a_team_members_replay_into_another_teams_queue(teams, wired):
    a, _b, operator = teams
    message = dead_letters(A_QUEUE, 1)[0]
    why = f"not in your team's scopes (vhost {wired})"
    for token in (ApiToken.issue(operator)[1], ApiToken.issue(operator, team=a)[1]):
        refused = replay(token, message, queue=B_QUEUE)
        assert refused.status_code == 400
        assert refused.json()["errors"] == {"queue": [why]}
    refused = replay(token, message, exchange="", routing_key=B_QUEUE)
    assert refused.json()["errors"] == {"routing_key": [why]}
    assert queue_depth(B_QUEUE) == 0
    assert Message.objects.get(pk=message.pk).status == Status.PENDING

    allowed = replay(token, message, queue=A_OTHER)
    assert allowed.status_code == 200 and allowed.json()["outcome"] == "confirmed"
    assert len(consume_until_idle(A_OTHER)) == 1


@pytest.mark.parametrize(
    "target, field",
    [
        ({"exchange": "recovery.dlx", "routing_key": "scope-a.orders"}, "exchange"),
        ({"queue": "recovery.dead_letters"}, "queue"),
        ({"queue": "recovery.returns"}, "queue"),
        ({"exchange": "", "routing_key": "recovery.unrouted"}, "routing_key"),
        ({"exchange": "recovery.unrouted", "routing_key": ""}, "exchange"),
        ({"exchange": "amq.direct", "routing_key": "scope-a.orders"}, "exchange"),
        ({"queue": "recovery.delay.10s"}, "queue"),
    ],
)
def test_it_refuses_lazarus_and_broker_names_as_targets_even_for_an_admin(wired, target, field):
    admin = make_user("reserved-admin", "admin")
    message = dead_letters(A_QUEUE, 1)[0]
    before = queue_depth("recovery.dead_letters")
    # An edit with x-original-* headers to recovery.dlx would be a forged dead letter.
    forged = {"headers": {"x-original-exchange": "scope-b", "x-original-routingKey": B_QUEUE}}
    response = replay(ApiToken.issue(admin)[1], message, **target, **forged)
    name = target.get("queue") or target["exchange"] or target["routing_key"]
    assert response.status_code == 400
    assert response.json()["errors"] == {
        field: [f"{name} is the broker's or Lazarus's own, not a replay target"]
    }
    assert queue_depth("recovery.dead_letters") == before
    assert Message.objects.get(pk=message.pk).status == Status.PENDING


def test_it_answers_400_for_names_past_amqp_limits_not_503(wired):
    operator = make_user("long-names", "operator")
    token = ApiToken.issue(operator)[1]
    message = dead_letters(A_QUEUE, 1)[0]
    # 246 bytes fit a shortstr; its delay route recovery.delay.10s.to.<name> does not.
    delayed = replay(token, message, exchange="e" * 246, routing_key="k", delay_seconds=10)
    assert delayed.status_code == 400
    assert delayed.json()["errors"] == {
        "exchange": ["with a delay of 10 s an exchange name may be at most 233 bytes"]
    }
    # 200 characters, 400 bytes: the serializer counts characters, the engine bytes.
    wide = replay(token, message, queue="é" * 200)
    assert wide.status_code == 400
    assert wide.json()["errors"] == {"queue": ["at most 255 bytes"]}
    nul = replay(token, message, exchange="a\x00b", routing_key="k")
    assert nul.status_code == 400
    assert Message.objects.get(pk=message.pk).status == Status.PENDING


def test_it_delays_only_to_an_exchange_that_exists(wired, amqp):
    operator = make_user("delay-made-up", "operator")
    message = dead_letters(A_QUEUE, 1)[0]
    response = replay(
        ApiToken.issue(operator)[1],
        message,
        exchange="made.up.exchange",
        routing_key="k",
        delay_seconds=10,
    )
    assert response.status_code == 400
    assert response.json()["errors"] == {
        "exchange": [
            f"no exchange 'made.up.exchange' in vhost '{wired}': a delayed replay goes only to "
            "an exchange that exists"
        ]
    }
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as gone:
        queue_depth("recovery.delay.10s.to.made.up.exchange")
    assert gone.value.reply_code == 404
    assert Message.objects.get(pk=message.pk).status == Status.PENDING


def masked_message():
    MaskRule.objects.create(kind="json_path", pattern="$.card")
    return dead_letters(A_QUEUE, 1, body=b'{"card": "4111111111111111"}')[0]


def test_it_sends_what_a_caller_may_not_read_in_full_only_to_its_own_target(wired, amqp):
    for queue in (A_QUEUE, A_OTHER):  # its own, not left by another test (they run anywhere)
        declare_app_queue(amqp, queue)
        amqp.queue_purge(queue)
    operator = make_user("masked-operator", "operator")
    token = ApiToken.issue(operator)[1]
    message = masked_message()
    refused = replay(token, message, queue=A_OTHER)
    assert refused.status_code == 400
    assert refused.json()["errors"] == {"queue": [NEEDS_FULL_READ]}
    assert queue_depth(A_OTHER) == 0

    set_privileges(operator, bodies=False)  # metadata only: no masks needed to refuse it
    unmasked = dead_letters(A_QUEUE, 1, body=b'{"order": 1}')[0]
    MaskRule.objects.all().delete()
    assert replay(token, unmasked, queue=A_OTHER).json()["errors"] == {"queue": [NEEDS_FULL_READ]}
    own = replay(token, unmasked)
    assert own.status_code == 200 and own.json()["outcome"] == "confirmed"

    set_privileges(operator, bodies=True, unmask=True)
    masked_message()
    allowed = replay(token, message, queue=A_OTHER)
    assert allowed.status_code == 200 and allowed.json()["outcome"] == "confirmed"
    assert [body for _p, body in consume_until_idle(A_OTHER)] == [b'{"card": "4111111111111111"}']


# ---- jobs -------------------------------------------------------------------------------------


def test_it_refuses_a_team_job_to_another_teams_queue(teams):
    _a, _b, operator = teams
    dead_letters(A_QUEUE, 2)
    with pytest.raises(ValidationError) as refused:
        create_job(
            operator, filters={"queue": A_QUEUE}, target_queue=B_QUEUE, scope=Scope.of(operator)
        )
    assert refused.value.message_dict == {"target_queue": ["not in your team's scopes"]}
    with pytest.raises(ValidationError) as reserved:
        create_job(operator, filters={"queue": A_QUEUE}, target_exchange="recovery.dlx")
    assert reserved.value.message_dict == {
        "target_exchange": ["recovery.dlx is the broker's or Lazarus's own, not a replay target"]
    }
    assert not ReplayJob.objects.exists()


def test_it_counts_what_a_team_job_left_out_only_within_the_teams_scope(teams):
    _a, b, _operator = teams
    b_operator = make_user("b-operator", None)
    Membership.objects.create(user=b_operator, team=b, role="operator")
    a_messages = dead_letters(A_QUEUE, 3)
    b_messages = dead_letters(B_QUEUE, 2)
    guessed = create_job(
        b_operator,
        message_ids=[m.pk for m in a_messages + b_messages],
        scope=Scope.of(b_operator),
    )
    broad = create_job(b_operator, filters={"status": "pending"}, scope=Scope.of(b_operator))
    assert run(guessed) == "done" and guessed.total == 2
    assert run(broad) == "done" and broad.total == 0
    # Neither tells team B how many of team A's messages the ids or the filter matched.
    assert not Activity.objects.filter(action="job_out_of_scope").exists()
    assert set(
        Message.objects.filter(pk__in=[m.pk for m in a_messages]).values_list("status", flat=True)
    ) == {Status.PENDING}


def test_it_stops_a_job_whose_creator_was_deactivated_before_it_ran(teams):
    _a, _b, operator = teams
    messages = dead_letters(A_QUEUE, 3)
    job = create_job(operator, filters={"queue": A_QUEUE}, scope=Scope.of(operator))
    operator.is_active = False
    operator.save()
    assert run(job) == "stopped"
    assert job.state == ReplayJob.State.CANCELLED
    assert job.state_reason == "stopped: its creator a-operator was deactivated"
    assert job.total == 0 and job.sent == 0
    stopped = Activity.objects.get(job=job, action="job_stopped")
    assert stopped.detail == {"reason": "stopped: its creator a-operator was deactivated"}
    assert queue_depth(A_QUEUE) == 0
    statuses = Message.objects.filter(pk__in=[m.pk for m in messages]).values_list("status")
    assert set(statuses) == {(Status.PENDING,)}


def test_it_stops_a_running_job_when_its_creator_is_demoted(teams):
    a, _b, operator = teams
    dead_letters(A_QUEUE, 20)
    job = create_job(operator, filters={"queue": A_QUEUE}, rate=2, scope=Scope.of(operator))
    outcome = {}
    thread = run_in_thread(job, outcome)
    wait_for(lambda: ReplayJob.objects.get(pk=job.pk).confirmed >= 1, message="first replay")
    Membership.objects.filter(user=operator, team=a).update(role="viewer")
    thread.join(15)
    assert outcome["r"] == "stopped"
    job.refresh_from_db()
    assert job.state == ReplayJob.State.CANCELLED
    assert (
        job.state_reason
        == "stopped: its creator a-operator is no longer an operator in team team-a"
    )
    # Stopped within a re-check (2 s) and a control tick of the demotion: at 2/s, a few sent.
    assert 1 <= job.confirmed <= 7
    assert job.items.filter(state="pending").count() == 20 - job.confirmed
    assert len(consume_until_idle(A_QUEUE)) == job.confirmed


def test_it_refuses_to_resume_a_job_whose_creator_left_the_team(teams):
    a, _b, operator = teams
    dead_letters(A_QUEUE, 2)
    job = create_job(operator, filters={"queue": A_QUEUE}, scope=Scope.of(operator))
    ReplayJob.objects.filter(pk=job.pk).update(state=ReplayJob.State.PAUSED)
    resumer = make_user("a-resumer", None)
    Membership.objects.create(user=resumer, team=a, role="operator")
    Membership.objects.filter(user=operator).delete()
    job.refresh_from_db()
    with pytest.raises(StateError) as refused:
        resume_job(job, resumer)
    assert refused.value.messages == [
        f"job #{job.pk} cannot be resumed: stopped: its creator a-operator is no longer an "
        "operator in team team-a"
    ]
    response = post(ApiToken.issue(resumer, team=a)[1], f"/api/v1/replay-jobs/{job.pk}/resume", {})
    assert response.status_code == 409
    assert ReplayJob.objects.get(pk=job.pk).state == ReplayJob.State.PAUSED


def test_it_skips_and_counts_what_leaves_the_scope_while_a_job_runs(teams):
    a, _b, operator = teams
    kept = dead_letters(A_QUEUE, 10)
    legacy = [m.pk for m in dead_letters("scope-a.legacy", 10)]
    job = create_job(
        operator, message_ids=[m.pk for m in kept] + legacy, rate=2, scope=Scope.of(operator)
    )
    outcome = {}
    thread = run_in_thread(job, outcome)
    wait_for(lambda: ReplayJob.objects.get(pk=job.pk).confirmed >= 1, message="first replay")
    # An admin narrows the team's scope while the job runs (the legacy ones claimed, waiting).
    TeamScope.objects.filter(team=a).update(queue_pattern=A_QUEUE)
    thread.join(30)
    assert outcome["r"] == "done"
    job.refresh_from_db()
    assert (job.confirmed, job.skipped) == (10, 10)
    assert set(job.items.filter(message_id__in=legacy).values_list("state", "detail")) == {
        ("skipped", LEFT_SCOPE)
    }
    left = Activity.objects.filter(job=job, action="job_out_of_scope")
    assert sum(row.detail["left_out"] for row in left) == 10
    assert {row.detail["at"] for row in left} == {"claim"}
    # No longer the team's: untouched by its job (no status, reason or history of it).
    assert set(Message.objects.filter(pk__in=legacy).values_list("status", "status_reason")) == {
        (Status.PENDING, "")
    }
    assert not MessageHistory.objects.filter(store_id__in=legacy, job_id=job.pk).exists()


def test_it_skips_job_items_a_masked_creator_sends_elsewhere(wired, amqp):
    declare_app_queue(amqp, A_OTHER)
    amqp.queue_purge(A_OTHER)
    operator = make_user("masked-job-operator", "operator")
    message = masked_message()
    plain = dead_letters(A_QUEUE, 1, body=b'{"order": 2}')[0]
    job = create_job(operator, message_ids=[message.pk, plain.pk], target_queue=A_OTHER)
    assert run(job) == "done"
    # A global rule masks both for this operator: neither is sent where they may read it.
    assert (job.confirmed, job.skipped) == (0, 2)
    assert set(job.items.values_list("detail", flat=True)) == {NOT_READABLE}
    assert queue_depth(A_OTHER) == 0
    own = create_job(operator, message_ids=[message.pk, plain.pk])
    assert run(own) == "done" and own.confirmed == 2

    set_privileges(operator, bodies=False)
    with pytest.raises(ValidationError) as refused:
        create_job(operator, message_ids=[message.pk], target_queue=A_OTHER)
    assert refused.value.message_dict == {"target_queue": [NEEDS_FULL_READ]}


def test_it_shows_a_team_only_the_died_again_copies_in_its_scope(teams):
    a, _b, operator = teams
    messages = dead_letters(A_QUEUE, 2)
    job = create_job(operator, filters={"queue": A_QUEUE}, scope=Scope.of(operator))
    assert run(job) == "done" and job.confirmed == 2
    mine = make_message(
        vhost=messages[0].vhost, source_queue=A_QUEUE, origin=messages[0], replay_count=1
    )
    theirs = make_message(
        vhost=messages[1].vhost, source_queue=B_QUEUE, origin=messages[1], replay_count=1
    )
    detail = ApiClient(Client(), operator, team=a).get(f"/api/v1/replay-jobs/{job.pk}")
    assert detail.json()["died_again"] == {"count": 1, "copies": [mine.pk]}
    client = Client()
    client.force_login(operator)
    page = client.get(reverse("job", args=[job.pk])).content.decode()
    assert f">#{mine.pk}</a>" in page and f">#{theirs.pk}</a>" not in page
    # A global caller sees both.
    admin = make_user("copies-admin", "admin")
    detail = ApiClient(Client(), admin).get(f"/api/v1/replay-jobs/{job.pk}")
    assert detail.json()["died_again"] == {"count": 2, "copies": [theirs.pk, mine.pk]}
