"""Bulk jobs: validation, dry run, targets, rate, cancel, pause/resume, snapshot semantics."""

import time

import pytest
from django.core.exceptions import PermissionDenied, ValidationError

from recovery.errors import StateError
from recovery.models import Activity, Message, ReplayAttempt, ReplayJob, ReplayJobItem, Status
from recovery.replay import discard_message, replay_message
from recovery.replay.jobs import create_job, dry_run
from tests.helpers import declare_app_queue, wait_for
from tests.helpers.replay import (
    consume_until_idle,
    dead_letters,
    queue_depth,
    run,
    run_in_thread,
    store,
    unroutable_row,
)

pytestmark = pytest.mark.django_db(transaction=True)


# ---- validation ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({}, "__all__"),
        ({"filters": {"kind": "nonsense"}}, "filters"),
        ({"filters": {"colour": "red"}}, "filters"),
        ({"filters": {"status": "discarded"}}, "filters"),
        ({"filters": {"status": "poisoned"}}, "include_poisoned"),
        ({"message_ids": ["x"]}, "message_ids"),
        ({"message_ids": []}, "message_ids"),
        ({"group_key": "g", "rate": 0}, "rate"),
        ({"group_key": "g", "rate": "fast"}, "rate"),
        ({"group_key": "g", "target_queue": "q", "target_exchange": "e"}, "target_queue"),
        ({"group_key": "g", "delay_seconds": 5}, "delay_seconds"),
        ({"group_key": "g", "canary_size": -1}, "canary_size"),
        (
            {"group_key": "g", "canary_size": 5, "canary_max_failure_pct": 0},
            "canary_max_failure_pct",
        ),
        ({"group_key": "g", "breaker_threshold_pct": 150}, "breaker_threshold_pct"),
        ({"group_key": "g", "via": "email"}, "via"),
        (
            {"group_key": "g", "delay_seconds": 10, "canary_size": 5, "canary_pause_seconds": 5},
            "canary_pause_seconds",
        ),
        ({"filters": {"queue": "no.such.queue"}}, "__all__"),  # nothing matches
    ],
)
def test_it_refuses_bad_jobs_naming_the_field(wired, operator, kwargs, field):
    dead_letters("jobs.valid", 1)

    with pytest.raises(ValidationError) as error:
        create_job(operator, **kwargs)

    assert field in error.value.message_dict
    assert not ReplayJob.objects.exists()


def test_only_operators_may_create_jobs(wired, viewer):
    dead_letters("jobs.perm", 1)

    with pytest.raises(PermissionDenied):
        create_job(viewer, filters={"queue": "jobs.perm"})


def test_dry_run_counts_where_messages_would_go_and_sends_nothing(wired, amqp):
    declare_app_queue(amqp, "jobs.a")
    dead_letters("jobs.a", 3)
    dead_letters("jobs.b", 2)
    store([unroutable_row("shop", "order.created") for _ in range(4)])

    preview = dry_run(filters={"status": "pending"}, rate=10, canary_size=2)

    rows = {(r["exchange"], r["routing_key"]): r["count"] for r in preview}
    assert rows == {("", "jobs.a"): 3, ("", "jobs.b"): 2, ("shop", "order.created"): 4}
    assert [r["count"] for r in preview] == [4, 3, 2]
    assert queue_depth("jobs.a") == 0
    assert dry_run(filters={"queue": "jobs.a"}, target_queue="elsewhere") == [
        {"exchange": "", "routing_key": "elsewhere", "count": 3, "vhost": wired, "via": ""}
    ]
    with pytest.raises(ValidationError):
        dry_run(filters={"queue": "jobs.a"}, rate=-1)


# ---- running -----------------------------------------------------------------------------------


def test_a_job_replays_every_selected_message_once_and_counts_them(wired, amqp, operator):
    declare_app_queue(amqp, "jobs.run")
    messages = dead_letters("jobs.run", 300)
    dead_letters("jobs.other", 5)  # not selected

    job = create_job(operator, filters={"queue": "jobs.run"})
    assert job.state == ReplayJob.State.QUEUED

    assert run(job, claim_batch=64) == "done"
    assert job.progress | {"reason": ""} == {
        "state": "done",
        "reason": "",
        "total": 300,
        "sent": 300,
        "confirmed": 300,
        "returned": 0,
        "failed": 0,
        "skipped": 0,
        "in_flight": 0,
        "remaining": 0,
        "dead_again": 0,
        "percent": 100.0,
    }
    assert not job.is_active
    got = consume_until_idle("jobs.run")
    assert sorted(p.message_id for p, _b in got) == sorted(m.message_id for m in messages)
    assert Message.objects.filter(source_queue="jobs.run", status=Status.REPLAYED).count() == 300
    assert Message.objects.filter(source_queue="jobs.other", status=Status.PENDING).count() == 5
    assert ReplayAttempt.objects.filter(job=job, outcome="confirmed", user=operator).count() == 300
    assert Activity.objects.filter(job=job, action="replay", user=operator).count() == 300
    actions = set(Activity.objects.filter(job=job).values_list("action", flat=True))
    assert {"job_created", "job_started", "job_done"} <= actions


def test_a_job_sends_every_body_byte_for_byte(wired, amqp, operator):
    """Bodies reach the runner as binary (no hex text): every byte value, an empty body and a
    4 MiB one arrive exactly as stored."""
    declare_app_queue(amqp, "jobs.bytes")
    bodies = [bytes(range(256)) * 3, b"", b"\x00" * 7, bytes(range(255, -1, -1)) * 16384]
    for body in bodies:
        dead_letters("jobs.bytes", 1, body=body)

    assert run(create_job(operator, filters={"queue": "jobs.bytes"})) == "done"

    assert sorted(body for _p, body in consume_until_idle("jobs.bytes")) == sorted(bodies)


def test_returned_and_nacked_messages_stay_pending_with_the_reason(wired, amqp, operator):
    declare_app_queue(amqp, "jobs.full", **{"x-max-length": 2, "x-overflow": "reject-publish"})
    dead_letters("jobs.full", 5)
    dead_letters("jobs.gone", 3)  # no such queue: returned

    job = create_job(operator, filters={"status": "pending"})

    assert run(job) == "done"
    assert (job.confirmed, job.returned, job.failed) == (2, 3, 3)
    returned = Message.objects.filter(source_queue="jobs.gone")
    assert all(m.status == Status.PENDING and "NO_ROUTE" in m.status_reason for m in returned)
    nacked = Message.objects.filter(source_queue="jobs.full", status=Status.PENDING)
    assert nacked.count() == 3 and all("nacked" in m.status_reason for m in nacked)
    assert ReplayJobItem.objects.filter(job=job, state="returned").count() == 3


def test_a_job_sends_to_the_chosen_target(wired, amqp, operator):
    amqp.exchange_declare("jobs.topic", "topic", durable=True)
    declare_app_queue(amqp, "jobs.retry")
    amqp.queue_bind("jobs.retry", "jobs.topic", "retry.#")
    dead_letters("jobs.first", 4)

    job = create_job(
        operator,
        filters={"queue": "jobs.first"},
        target_exchange="jobs.topic",
        target_routing_key="retry.now",
    )

    assert run(job) == "done"
    assert len(consume_until_idle("jobs.retry")) == 4
    assert set(ReplayAttempt.objects.values_list("exchange", "routing_key")) == {
        ("jobs.topic", "retry.now")
    }


def test_a_delayed_job_parks_messages_in_the_delay_queue(wired, amqp, operator, settings):
    settings.REPLAY_DELAYS = [2]
    declare_app_queue(amqp, "jobs.later")
    dead_letters("jobs.later", 10)

    job = create_job(operator, filters={"queue": "jobs.later"}, delay_seconds=2)
    assert run(job) == "done"

    assert job.confirmed == 10
    assert queue_depth("jobs.later") == 0
    assert queue_depth("recovery.delay.2s") == 10
    wait_for(lambda: queue_depth("jobs.later") == 10, timeout=15, message="delayed arrival")


def test_a_delayed_job_declares_its_route_on_the_connection_it_publishes_on(
    wired, amqp, operator, settings, monkeypatch
):
    """RabbitMQ 4.2+ (Khepri) confirms a declaration at a majority: a publish on another
    connection, maybe to another node, may not find a new delay exchange yet. The job opens no
    connection but its publisher's (a blocking one is how a route used to be declared)."""
    import pika

    settings.REPLAY_DELAYS = [3]
    amqp.exchange_delete("recovery.delay.3s")
    amqp.queue_delete("recovery.delay.3s")
    declare_app_queue(amqp, "jobs.khepri")
    dead_letters("jobs.khepri", 20)
    opened = []
    real = pika.BlockingConnection
    monkeypatch.setattr(
        pika, "BlockingConnection", lambda *a, **k: opened.append(1) or real(*a, **k)
    )

    job = create_job(operator, filters={"queue": "jobs.khepri"}, delay_seconds=3)
    assert run(job) == "done"

    assert opened == []
    assert job.confirmed == 20
    assert queue_depth("recovery.delay.3s") == 20
    amqp.queue_delete("recovery.delay.3s")
    amqp.exchange_delete("recovery.delay.3s")


def test_a_delay_route_the_broker_refuses_fails_its_items_with_the_reason(
    wired, amqp, operator, settings
):
    settings.REPLAY_DELAYS = [4]
    amqp.exchange_delete("recovery.delay.4s")
    amqp.queue_delete("recovery.delay.4s")
    # A queue of the route's name with other arguments: its declaration is refused (406).
    amqp.queue_declare("recovery.delay.4s", durable=True, arguments={"x-message-ttl": 99})
    declare_app_queue(amqp, "jobs.refused")
    dead_letters("jobs.refused", 5)

    job = create_job(operator, filters={"queue": "jobs.refused"}, delay_seconds=4)
    run(job)

    assert job.confirmed == 0 and job.failed == 5
    details = set(ReplayJobItem.objects.filter(job=job).values_list("detail", flat=True))
    assert len(details) == 1
    [detail] = details
    assert "the delay route recovery.delay.4s could not be declared: 406" in detail
    assert "x-message-ttl" in detail
    assert queue_depth("recovery.delay.4s") == 0
    amqp.queue_delete("recovery.delay.4s")


def test_a_rate_limited_job_keeps_its_rate(wired, amqp, operator):
    declare_app_queue(amqp, "jobs.slow")
    dead_letters("jobs.slow", 150)
    job = create_job(operator, filters={"queue": "jobs.slow"}, rate=100)

    started = time.monotonic()
    assert run(job) == "done"
    elapsed = time.monotonic() - started

    # 150 messages at 100/s: 1.5 s of sending, plus start-up; never much faster than the rate.
    assert 1.3 <= elapsed < 6, elapsed
    assert job.confirmed == 150


def test_cancel_stops_a_running_job_and_leaves_the_rest_pending(wired, amqp, operator):
    declare_app_queue(amqp, "jobs.cancel")
    dead_letters("jobs.cancel", 400)
    job = create_job(operator, filters={"queue": "jobs.cancel"}, rate=100)
    outcome = {}
    thread = run_in_thread(job, outcome)
    wait_for(lambda: ReplayJob.objects.get(pk=job.pk).confirmed >= 50, message="progress")

    job.cancel(operator, via="api")
    thread.join(15)

    job.refresh_from_db()
    assert outcome["r"] == "cancelled"
    assert job.state == "cancelled" and job.finished_at is not None
    assert 50 <= job.confirmed < 400
    replayed = Message.objects.filter(status=Status.REPLAYED).count()
    assert replayed == job.confirmed == len(consume_until_idle("jobs.cancel"))
    assert Message.objects.filter(status=Status.PENDING).count() == 400 - replayed
    assert not ReplayJobItem.objects.filter(state="claimed").exists()
    assert Activity.objects.get(action="job_cancelled").via == "api"
    with pytest.raises(ValidationError):
        job.cancel(operator)  # already ended
    with pytest.raises(StateError):
        job.resume(operator)


def test_a_paused_job_resumes_where_it_stopped(wired, amqp, operator, settings):
    declare_app_queue(amqp, "jobs.pause")
    dead_letters("jobs.pause", 60)
    job = create_job(operator, filters={"queue": "jobs.pause"})
    # Pause it by hand (the canary and the breaker do the same) before it runs.
    ReplayJob.objects.filter(pk=job.pk).update(state="paused", state_reason="test")
    job.refresh_from_db()
    assert run(job) == "gone"

    job.resume(operator)

    job.refresh_from_db()
    assert job.state == "queued"
    assert run(job) == "done"
    assert job.confirmed == 60
    assert Activity.objects.filter(action="job_resumed", user=operator).exists()


def test_a_job_replays_only_what_was_selected_when_it_was_made(wired, amqp, operator):
    """Messages collected after the job was created — like its own replays dying again — are
    not part of it, nor are those discarded or replayed before it started."""
    declare_app_queue(amqp, "jobs.snap")
    first = dead_letters("jobs.snap", 5)
    job = create_job(operator, filters={"queue": "jobs.snap"})
    dead_letters("jobs.snap", 3)  # arrives after the job was made
    discard_message(first[0], operator)
    replay_message(first[1], user=operator)
    consume_until_idle("jobs.snap")

    assert run(job) == "done"

    assert (job.total, job.confirmed, job.skipped) == (3, 3, 0)
    assert Message.objects.filter(source_queue="jobs.snap", status="pending").count() == 3
    assert first[1].attempts.count() == 1  # never sent twice


def test_messages_changed_while_a_job_runs_are_skipped_not_resent(wired, amqp, operator):
    declare_app_queue(amqp, "jobs.skip")
    messages = dead_letters("jobs.skip", 40)
    # An id list may include replayed messages (the operator picked them): only the replay
    # count tells that someone replayed one after the job was made.
    job = create_job(operator, message_ids=[m.pk for m in messages], rate=20)
    outcome = {}
    thread = run_in_thread(job, outcome, claim_batch=5)
    wait_for(lambda: ReplayJob.objects.get(pk=job.pk).sent >= 1, message="the job to start")
    discard_message(messages[-1], operator)  # the last ones are claimed last
    replay_message(messages[-2], user=operator)
    thread.join(30)

    assert outcome["r"] == "done"
    job.refresh_from_db()
    assert (job.total, job.confirmed, job.skipped) == (40, 38, 2)
    details = set(ReplayJobItem.objects.filter(state="skipped").values_list("detail", flat=True))
    assert details == {
        "skipped: the message is discarded now",
        "skipped: replayed by someone else since the job was created",
    }
    assert messages[-2].attempts.count() == 1  # never sent twice
    assert len(consume_until_idle("jobs.skip")) == 39


def test_poisoned_messages_are_skipped_unless_asked_for(wired, amqp, operator):
    declare_app_queue(amqp, "jobs.poison")
    messages = dead_letters("jobs.poison", 4)
    Message.objects.filter(pk__in=[m.pk for m in messages[:2]]).update(status=Status.POISONED)

    plain = create_job(operator, filters={"queue": "jobs.poison"})
    assert run(plain) == "done" and plain.total == 2

    forced = create_job(operator, filters={"queue": "jobs.poison"}, include_poisoned=True)
    assert run(forced) == "done" and forced.total == 2  # the other two are replayed now
    assert Message.objects.filter(status=Status.REPLAYED).count() == 4


def test_an_id_list_job_and_a_failure_group_job(wired, amqp, operator):
    declare_app_queue(amqp, "jobs.ids")
    messages = dead_letters("jobs.ids", 6)

    by_ids = create_job(operator, message_ids=[messages[0].pk, messages[1].pk])
    assert run(by_ids) == "done" and by_ids.confirmed == 2

    group = create_job(operator, group_key=messages[0].group_key)
    assert run(group) == "done"
    assert group.total == 4  # the group's pending ones; the two replayed are not re-sent
    assert len(consume_until_idle("jobs.ids")) == 6


def test_one_click_replay_and_discard_refuse_a_message_a_job_holds(wired, amqp, operator):
    dead_letters("jobs.held", 3)
    job = create_job(operator, filters={"queue": "jobs.held"})
    message = Message.objects.filter(source_queue="jobs.held").first()
    ReplayJobItem.objects.create(job=job, message=message, state="claimed", claimed_by="someone")

    with pytest.raises(StateError, match=f"job #{job.pk}"):
        replay_message(message, user=operator)
    with pytest.raises(StateError, match=f"job #{job.pk}"):
        discard_message(message, operator)
    message.refresh_from_db()
    assert message.status == Status.PENDING
