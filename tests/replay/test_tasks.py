"""Jobs in real Celery workers, the stall sweep, and retention."""

import datetime

import pytest
import time_machine
from django.conf import settings
from django.utils import timezone

from recovery.models import Activity, Message, ReplayJob, ReplayJobItem, Status
from recovery.replay import discard_message
from recovery.replay.jobs import create_job, resume_stalled_jobs
from recovery.retention.run import apply_retention
from tests.helpers import declare_app_queue, point_celery_at, wait_for
from tests.helpers.replay import consume_until_idle, dead_letters, purge_tasks, queue_depth, run

pytestmark = pytest.mark.django_db(transaction=True)


def job_state(job):
    return ReplayJob.objects.get(pk=job.pk).state


def wait_for_state(job, state, worker, timeout=60):
    try:
        wait_for(lambda: job_state(job) == state, timeout=timeout, message=f"job {state}")
    except AssertionError as exc:
        progress = ReplayJob.objects.get(pk=job.pk).progress
        raise AssertionError(f"{exc}; {progress}; the worker's log:\n{worker.log()}") from None


@pytest.mark.slow  # a real Celery worker process
def test_a_job_runs_in_a_celery_worker(wired, amqp, operator, workers):
    purge_tasks()
    declare_app_queue(amqp, "tasks.run")
    dead_letters("tasks.run", 200)
    worker = workers()

    job = create_job(operator, filters={"queue": "tasks.run"})  # enqueued on commit

    wait_for_state(job, "done", worker)
    job.refresh_from_db()
    assert job.confirmed == 200
    assert len(consume_until_idle("tasks.run")) == 200


@pytest.mark.slow  # a real Celery worker process
def test_a_task_from_another_deployment_runs_nothing(wired, operator, workers):
    """The task carries the job's token: a foreign task with a matching id is ignored."""
    from recovery.replay.tasks import run_replay_job

    purge_tasks()
    dead_letters("tasks.token", 3)
    job = create_job(operator, filters={"queue": "tasks.token"})
    purge_tasks()  # drop the real task; send one with a wrong token
    run_replay_job.apply_async((job.pk, "00000000-0000-0000-0000-000000000000"))
    worker = workers()

    wait_for(lambda: "recovery.replay.tasks.run_replay_job" in worker.log(), timeout=30)
    wait_for(lambda: "gone" in worker.log(), timeout=30, message=worker.log())
    assert job_state(job) == "queued"


@pytest.mark.slow
def test_a_task_sent_by_its_old_name_still_runs_the_job(wired, amqp, operator, workers):
    """Task messages the previous release queued name ``recovery.tasks.run_replay_job``: a
    worker of this one runs them (recovery/old_task_names.py, for one release)."""
    from console.celery import app

    purge_tasks()
    declare_app_queue(amqp, "tasks.old_name")
    dead_letters("tasks.old_name", 3)
    job = create_job(operator, filters={"queue": "tasks.old_name"})
    purge_tasks()  # drop the task sent by its new name; send it as the previous release did
    app.send_task(
        "recovery.tasks.run_replay_job",
        (job.pk, str(job.token)),
        queue=settings.REPLAY_TASK_QUEUE,
        retry=False,
    )
    worker = workers()

    wait_for_state(job, "done", worker)
    assert len(consume_until_idle("tasks.old_name")) == 3


def test_the_sweep_enqueues_jobs_whose_runner_died(wired, operator):
    purge_tasks()
    dead_letters("tasks.sweep", 3)
    stalled = create_job(operator, filters={"queue": "tasks.sweep"})
    fresh = create_job(operator, filters={"queue": "tasks.sweep"})
    long_ago = timezone.now() - datetime.timedelta(minutes=5)
    ReplayJob.objects.filter(pk=stalled.pk).update(
        state="running", runner="dead-host:1:x", heartbeat_at=long_ago, enqueued_at=long_ago
    )
    purge_tasks()

    assert resume_stalled_jobs() == [stalled.pk]  # the fresh queued one was just enqueued

    assert queue_depth(settings.REPLAY_TASK_QUEUE) == 1  # jobs have a queue of their own
    assert resume_stalled_jobs() == []  # not again until another lease has passed
    assert fresh.pk not in resume_stalled_jobs()


def test_cancelling_a_job_whose_runner_died_frees_its_messages(wired, operator):
    [message] = dead_letters("tasks.orphan", 1)
    job = create_job(operator, filters={"queue": "tasks.orphan"})
    ReplayJob.objects.filter(pk=job.pk).update(
        state="running",
        runner="dead-host:1:x",
        heartbeat_at=timezone.now() - datetime.timedelta(minutes=5),
    )
    ReplayJobItem.objects.create(job=job, message=message, state="claimed", claimed_by="x")

    job.cancel(operator)

    assert not ReplayJobItem.objects.filter(state="claimed").exists()
    discard_message(message, operator)  # no longer held


def test_a_broker_failure_at_enqueue_leaves_the_job_queued(wired, operator, settings):
    dead_letters("tasks.nobroker", 1)
    job = create_job(operator, filters={"queue": "tasks.nobroker"})
    point_celery_at("amqp://guest:guest@127.0.0.1:1//")  # nothing listens there

    assert job.enqueue() is False

    assert job_state(job) == "queued"  # the sweep sends it when the broker is back


# ---- retention -----------------------------------------------------------------------------


def test_retention_removes_old_replayed_and_discarded_messages_only(wired, operator, settings):
    settings.RETENTION_DAYS = 30
    old = timezone.now() - datetime.timedelta(days=31)
    replayed, discarded, pending, poisoned, recent = dead_letters("tasks.retention", 5)
    discard_message(discarded, operator)
    Message.objects.filter(pk=replayed.pk).update(status=Status.REPLAYED)
    Message.objects.filter(pk=poisoned.pk).update(status=Status.POISONED)
    Message.objects.filter(pk=recent.pk).update(status=Status.REPLAYED)
    Message.objects.filter(pk__in=[replayed.pk, discarded.pk, pending.pk, poisoned.pk]).update(
        updated_at=old
    )

    result = apply_retention()

    assert result["messages"] == 2
    left = set(Message.objects.values_list("pk", flat=True))
    assert left == {pending.pk, poisoned.pk, recent.pk}
    discard = Activity.objects.get(action="discard")
    assert discard.message is None and discard.detail["message"] == discarded.pk
    assert Activity.objects.get(action="retention").detail["messages"] == 2
    assert apply_retention()["messages"] == 0


def test_retention_counts_its_days_from_the_last_change_on_the_clock(wired, operator, settings):
    """The clock moves, not the data: a replayed message stays until RETENTION_DAYS after its
    last change, to the second, and goes right after."""
    settings.RETENTION_DAYS = 30
    [message] = dead_letters("tasks.clock", 1)
    Message.objects.filter(pk=message.pk).update(status=Status.REPLAYED)
    changed = Message.objects.get(pk=message.pk).updated_at
    kept_until = changed + datetime.timedelta(days=30)

    with time_machine.travel(kept_until - datetime.timedelta(seconds=1), tick=False):
        assert apply_retention()["messages"] == 0
    assert Message.objects.filter(pk=message.pk).exists()
    with time_machine.travel(kept_until + datetime.timedelta(seconds=1), tick=False):
        result = apply_retention()
    assert result["messages"] == 1
    cutoff = datetime.datetime.fromisoformat(result["cutoff"])
    assert abs(cutoff - changed - datetime.timedelta(seconds=1)).total_seconds() < 0.001
    assert not Message.objects.filter(pk=message.pk).exists()


def test_retention_drops_the_items_of_long_finished_jobs(wired, amqp, operator):
    declare_app_queue(amqp, "tasks.items")
    dead_letters("tasks.items", 3)
    job = create_job(operator, filters={"queue": "tasks.items"})
    assert run(job) == "done"
    ReplayJob.objects.filter(pk=job.pk).update(
        finished_at=timezone.now() - datetime.timedelta(days=400)
    )

    result = apply_retention()

    assert result["job_items"] == 3  # the messages were replayed today: they stay
    job.refresh_from_db()
    assert job.confirmed == 3 and not job.items.exists()


@pytest.mark.slow  # a real Celery worker process
def test_a_worker_shutting_down_hands_its_job_to_another(wired, amqp, operator, workers):
    purge_tasks()
    declare_app_queue(amqp, "tasks.handover")
    dead_letters("tasks.handover", 600)
    first = workers()
    job = create_job(operator, filters={"queue": "tasks.handover"}, rate=60)
    wait_for(lambda: ReplayJob.objects.get(pk=job.pk).confirmed >= 60, timeout=60)

    first.stop()  # SIGTERM: a warm shutdown

    job.refresh_from_db()
    assert job.state == "queued" and "worker shut down" in job.state_reason
    assert not ReplayJobItem.objects.filter(job=job, state="claimed").exists()
    second = workers()
    wait_for_state(job, "done", second, timeout=60)
    ids = [props.message_id for props, _body in consume_until_idle("tasks.handover")]
    assert len(ids) == len(set(ids)) == 600  # handed over cleanly: not one duplicate


def test_retention_leaves_a_message_a_job_holds(wired, operator):
    [message] = dead_letters("tasks.held", 1)
    job = create_job(operator, filters={"queue": "tasks.held"})
    ReplayJobItem.objects.create(job=job, message=message, state="claimed", claimed_by="x")
    Message.objects.filter(pk=message.pk).update(
        status=Status.REPLAYED, updated_at=timezone.now() - datetime.timedelta(days=400)
    )

    assert apply_retention()["messages"] == 0


# ---- slow rates do not hold workers (#20) ----------------------------------------------------


def test_a_slow_rate_hands_the_worker_back_between_messages(wired, amqp, operator):
    purge_tasks()
    declare_app_queue(amqp, "tasks.slow")
    dead_letters("tasks.slow", 3)
    job = create_job(operator, filters={"queue": "tasks.slow"}, rate=0.1)  # one per 10 s
    purge_tasks()  # its task; this test runs the job in this thread instead

    assert run(job) == "sleeping"  # the first message is 10 s away: nothing holds a worker
    assert job.state == ReplayJob.State.QUEUED
    assert job.progress["reason"] == "rate 0.1/s: the next message goes in 10 s"
    assert queue_depth(settings.REPLAY_TASK_QUEUE) == 1  # its task again, with a countdown
    assert job.enqueued_at > timezone.now() + datetime.timedelta(seconds=8)  # not "stalled"
    assert consume_until_idle("tasks.slow") == []

    purge_tasks()
    assert run(job, paced=True) == "sleeping"  # the countdown's run: one message, then sleep
    assert len(consume_until_idle("tasks.slow")) == 1
    assert job.confirmed == 1 and job.state == ReplayJob.State.QUEUED


@pytest.mark.slow  # a real Celery worker process
def test_slow_jobs_do_not_starve_a_worker_of_other_work(wired, amqp, operator, workers):
    purge_tasks()
    for queue in ("tasks.crawl1", "tasks.crawl2", "tasks.quick"):
        declare_app_queue(amqp, queue)
    dead_letters("tasks.crawl1", 3)
    dead_letters("tasks.crawl2", 3)
    dead_letters("tasks.quick", 50)
    worker = workers()  # two slots

    slow = [create_job(operator, filters={"queue": f"tasks.crawl{n}"}, rate=0.001) for n in (1, 2)]
    for job in slow:
        wait_for(
            lambda job=job: (
                ReplayJob.objects.get(pk=job.pk).progress["reason"].startswith("rate 0.001/s")
            ),
            timeout=60,
            message="the slow job to hand its worker back",
        )
    quick = create_job(operator, filters={"queue": "tasks.quick"})

    wait_for_state(quick, "done", worker, timeout=60)
    assert len(consume_until_idle("tasks.quick")) == 50
    assert [job_state(job) for job in slow] == ["queued", "queued"]
