"""Safety: canary, circuit breaker, crash takeover, concurrent jobs and claimers."""

import html
import re
import threading
from collections import Counter
from datetime import timedelta

import pytest
from django.utils import timezone

from recovery.models import Activity, Message, ReplayJob, ReplayJobItem, Status
from recovery.replay.job_store import JobStore
from recovery.replay.jobs import create_job, resume_stalled_jobs
from recovery.replay.runner import JobRunner
from tests.helpers import declare_app_queue, wait_for
from tests.helpers.replay import consume_until_idle, dead_letters, populated, run, run_in_thread

pytestmark = pytest.mark.django_db(transaction=True)


def came_back(queue):
    """Rows the collector stored for replayed messages that died again in ``queue``."""
    return Message.objects.filter(source_queue=queue, origin__isnull=False)


# ---- canary ------------------------------------------------------------------------------------


def test_a_canary_that_dies_again_pauses_the_job(collector, amqp, operator, consumers):
    declare_app_queue(amqp, "safe.canary")
    dead_letters("safe.canary", 30)
    consumer = consumers("safe.canary", reject=True)  # the consumer is still broken
    job = create_job(
        operator,
        filters={"queue": "safe.canary"},
        canary_size=5,
        canary_pause_seconds=2,
        canary_max_failure_pct=50,
    )

    assert run(job) == "paused"

    assert job.state == "paused"
    assert job.confirmed == 5
    assert job.state_reason.startswith("canary: 5 of 5 canary messages (100%) came back")
    assert came_back("safe.canary").count() == 5
    originals = Message.objects.filter(source_queue="safe.canary", origin__isnull=True)
    assert originals.filter(status=Status.PENDING).count() == 25
    assert Activity.objects.filter(job=job, action="job_paused").exists()

    # The consumer is fixed; the operator resumes, which accepts the canary.
    consumer.reject = False
    job.resume(operator)
    assert run(job) == "done"
    assert job.confirmed == 30
    assert job.canary_passed_at is not None


def test_a_healthy_canary_lets_the_job_continue(collector, amqp, operator, consumers):
    declare_app_queue(amqp, "safe.fine")
    dead_letters("safe.fine", 40)
    consumer = consumers("safe.fine")
    job = create_job(
        operator, filters={"queue": "safe.fine"}, canary_size=10, canary_pause_seconds=1
    )

    assert run(job) == "done"

    assert job.confirmed == 40 and job.canary_passed_at is not None
    assert job.canary_max_failure_pct == 10.0  # the setting's default
    assert Activity.objects.filter(job=job, action="job_canary_passed").exists()
    wait_for(lambda: consumer.total == 40, message="40 consumed")
    assert not came_back("safe.fine").exists()


# ---- circuit breaker ----------------------------------------------------------------------------


def test_the_circuit_breaker_pauses_a_job_whose_messages_die_again(
    collector, amqp, operator, consumers, settings
):
    settings.REPLAY_BREAKER_MIN_SAMPLE = 20
    declare_app_queue(amqp, "safe.breaker")
    dead_letters("safe.breaker", 400)
    consumers("safe.breaker", reject=True)
    # 50 msgs/s leaves the job ~7 s after a resume: time for the rejected replays to come back
    # through DLX + collector on a loaded machine before the job could send everything.
    job = create_job(operator, filters={"queue": "safe.breaker"}, rate=50, breaker_threshold_pct=50)

    assert run(job) == "paused"

    assert job.state_reason.startswith("circuit breaker: ")
    assert "threshold 50%" in job.state_reason
    # It may trip before 20 replays: at 10 deaths the sample's verdict is certain (the rule's
    # own test below).
    assert job.confirmed < 400
    assert job.dead_again >= 10
    first_stop = job.confirmed

    # Resumed with the consumer still broken: the breaker judges afresh and trips again.
    job.resume(operator)
    job.refresh_from_db()
    assert (job.breaker_base_confirmed, job.breaker_base_dead) == (first_stop, job.dead_again)
    assert run(job) == "paused"
    assert job.state_reason.startswith("circuit breaker: ")
    assert job.confirmed > first_stop
    assert (
        Message.objects.filter(
            source_queue="safe.breaker", origin__isnull=True, status=Status.PENDING
        ).count()
        == 400 - job.confirmed
    )


def test_the_breaker_says_what_it_waits_for_and_pauses_once_the_verdict_is_certain(
    collector, amqp, operator, consumers, settings, client, api
):
    """The reported job ran on, silent, until 14 of 17 replays had come back at a 50 %
    threshold: the breaker waited for its sample of 20. Now the job page and the API say what it
    waits for while it runs, and it pauses at the 10th death (10 of 20 is 50 % whatever the
    rest of the sample does), with that reason."""
    settings.REPLAY_BREAKER_MIN_SAMPLE = 20
    declare_app_queue(amqp, "safe.early")
    dead_letters("safe.early", 60)
    consumers("safe.early", reject=True)  # every replay comes back through recovery.dlx
    # 2 msgs/s: the 20th replay is 10 s away, the 10th death about 5-6 s (reject, dead-letter,
    # collect): room for a loaded machine, and a mid-run to look at.
    job = create_job(operator, filters={"queue": "safe.early"}, rate=2, breaker_threshold_pct=50)
    client.force_login(operator)
    api.as_user(operator)
    outcome = {}
    thread = run_in_thread(job, outcome)

    judging = re.compile(
        r"judging after 20 replays; (\d+) since the start, ([1-9]\d*) came back \((\d+) %\)"
    )
    seen = {}

    def mid_run():
        seen["api"] = api.get(f"/api/v1/replay-jobs/{job.pk}").json()
        seen["page"] = client.get(f"/jobs/{job.pk}/").content.decode()
        breaker = seen["api"]["breaker"]
        return (
            breaker["phase"] == "judging" and breaker["came_back"] and judging.search(seen["page"])
        )

    wait_for(mid_run, timeout=20, interval=0.2, message="the breaker judging, with deaths")
    breaker = seen["api"]["breaker"]
    assert seen["api"]["state"] == "running"
    assert (breaker["threshold_pct"], breaker["min_sample"], breaker["trips_early_at"]) == (
        50.0,
        20,
        10,
    )
    assert 0 < breaker["came_back"] <= breaker["replayed"] < 20
    assert breaker["summary"].startswith("circuit breaker: judging after 20 replays; ")
    assert "Pauses at 50 %, or as soon as 10 have come back" in seen["page"]

    thread.join(60)
    assert outcome.get("r") == "paused"
    job.refresh_from_db()
    assert job.state_reason.startswith("circuit breaker: ")
    assert "before the sample of 20 was full" in job.state_reason
    assert "threshold 50%" in job.state_reason
    assert job.confirmed < 20 and job.dead_again >= 10
    assert Activity.objects.get(job=job, action="job_paused").detail["reason"] == job.state_reason

    after = api.get(f"/api/v1/replay-jobs/{job.pk}").json()
    assert after["state"] == "paused" and after["state_reason"] == job.state_reason
    assert after["breaker"]["phase"] == "tripped" and after["breaker"]["reason"]
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert html.escape(job.state_reason) in page
    assert "Circuit breaker tripped at 50 %: " in page


# ---- crashes and concurrency --------------------------------------------------------------------


class Crash(BaseException):
    """A runner dying mid-job (not an Exception: nothing catches it, nothing cleans up)."""


class CrashingRunner(JobRunner):
    """Dies right after claiming a batch, once 150 messages were confirmed."""

    def _stage(self, claimed):
        super()._stage(claimed)
        if self.confirmed >= 150:
            raise Crash()


def test_a_crashed_runner_is_taken_over_and_nothing_is_lost(wired, amqp, operator, consumers):
    declare_app_queue(amqp, "safe.crash")
    messages = dead_letters("safe.crash", 500)
    consumer = consumers("safe.crash")
    job = create_job(operator, filters={"queue": "safe.crash"})
    window = 60

    with pytest.raises(Crash):
        CrashingRunner(job.pk, job.token, window=window, claim_batch=20, lease_seconds=1).run()

    job.refresh_from_db()
    assert job.state == "running" and job.runner  # as a dead worker leaves it
    assert ReplayJobItem.objects.filter(job=job, state="claimed").exists()

    assert run(job, window=window, claim_batch=20, lease_seconds=1) == "done"

    assert job.confirmed == 500 and job.total == 500
    assert Activity.objects.filter(job=job, action="job_taken_over").exists()
    wait_for(lambda: len(consumer.seen) == 500, message="every message consumed")
    assert set(consumer.seen) == {m.message_id for m in messages}
    duplicates = consumer.total - len(consumer.seen)
    assert duplicates <= window, duplicates


def test_a_live_runner_keeps_its_job(wired, amqp, operator):
    declare_app_queue(amqp, "safe.live")
    dead_letters("safe.live", 300)
    job = create_job(operator, filters={"queue": "safe.live"}, rate=60)
    outcome = {}
    thread = run_in_thread(job, outcome, lease_seconds=2)
    wait_for(lambda: ReplayJob.objects.get(pk=job.pk).sent >= 5, message="the job running")

    # A second task for the same job (a duplicate enqueue) waits out the lease, sees the
    # heartbeat move, and leaves.
    assert JobRunner(job.pk, job.token, lease_seconds=2).run() == "busy"
    assert resume_stalled_jobs() == []
    thread.join(30)
    assert outcome["r"] == "done"
    assert len(consume_until_idle("safe.live")) == 300


def test_overlapping_jobs_never_send_a_message_twice(wired, amqp, operator, consumers):
    declare_app_queue(amqp, "safe.overlap")
    messages = dead_letters("safe.overlap", 300)
    consumer = consumers("safe.overlap")
    by_filter = create_job(operator, filters={"queue": "safe.overlap"})
    by_ids = create_job(operator, message_ids=[m.pk for m in messages])
    outcomes = [{}, {}]

    threads = [
        run_in_thread(by_filter, outcomes[0], claim_batch=10),
        run_in_thread(by_ids, outcomes[1], claim_batch=10),
    ]
    for thread in threads:
        thread.join(60)

    assert [o["r"] for o in outcomes] == ["done", "done"]
    by_filter.refresh_from_db()
    by_ids.refresh_from_db()
    assert by_filter.confirmed + by_ids.confirmed == 300
    # A message both jobs selected was sent by one and skipped by the other.
    skipped = by_filter.skipped + by_ids.skipped
    assert by_filter.total + by_ids.total == 300 + skipped
    wait_for(lambda: consumer.total >= 300, message="300 consumed")
    assert consumer.total == len(consumer.seen) == 300


def test_concurrent_claimers_never_claim_the_same_item(wired, operator):
    job, owner, _messages = populated("safe.claims", 600, operator)
    owner.close()
    claimed = {"runner-a": [], "runner-b": [], "runner-c": []}

    def claim_all(name):
        store = JobStore(job.pk, name)
        while True:
            rows, _skipped, any_left = store.claim(7, ["pending"])
            if not any_left:
                break
            claimed[name].extend(row.item_id for row in rows)
        store.close()

    threads = [threading.Thread(target=claim_all, args=(name,)) for name in claimed]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)

    every = Counter(item for items in claimed.values() for item in items)
    assert len(every) == 600 and max(every.values()) == 1
    assert all(claimed.values())  # they really ran side by side
    owners = dict(ReplayJobItem.objects.filter(job=job).values_list("id", "claimed_by"))
    for name, items in claimed.items():
        assert {owners[item] for item in items} == {name}


def test_items_a_deposed_runner_claims_after_the_takeover_are_sent(
    wired, amqp, operator, monkeypatch
):
    """A runner that lost its lease (a long pause) may still finish a claim after the new runner
    put back what was claimed when it took over; the new runner must not wait on those forever."""
    declare_app_queue(amqp, "safe.deposed")
    job, old, _messages = populated("safe.deposed", 40, operator, runner="runner-old")
    rows, _skipped, _left = old.claim(5, ["pending"])
    assert len(rows) == 5
    ReplayJob.objects.filter(pk=job.pk).update(heartbeat_at=timezone.now() - timedelta(hours=1))
    old.close()
    # As if the old runner's claim landed after the new runner's takeover: the new runner's
    # start-up reclaim finds nothing.
    monkeypatch.setattr(JobStore, "reclaim", _reclaim_nothing_first(JobStore.reclaim))

    outcome = {}
    thread = run_in_thread(job, outcome)
    thread.join(60)
    if thread.is_alive():
        ReplayJob.objects.filter(pk=job.pk).update(state=ReplayJob.State.CANCELLED)
        thread.join(10)
    assert outcome.get("r") == "done"
    job.refresh_from_db()
    assert (job.total, job.confirmed) == (40, 40)
    assert len(consume_until_idle("safe.deposed")) == 40


def _reclaim_nothing_first(reclaim):
    calls = []

    def patched(self):
        calls.append(1)
        return 0 if len(calls) == 1 else reclaim(self)

    return patched


# ---- discard by filter beside replays -----------------------------------------------------------


def test_a_discard_by_filter_skips_what_a_job_or_a_replay_holds(wired, operator):
    """Claimed items (a running job) and rows locked by a replay in progress are left alone and
    counted as remaining; once released, the next call discards them."""
    import psycopg

    from recovery.db import database_conninfo
    from recovery.replay import discard_matching

    job, store, messages = populated("safe.discard", 30, operator)
    claimed, _skipped, _left = store.claim(4, ["pending"])
    held = {c.message_id for c in claimed}
    locked = messages[-1].pk
    with psycopg.connect(database_conninfo()) as other:  # a one-click replay's lock
        other.execute("SELECT 1 FROM recovery_message WHERE id = %s FOR UPDATE", (locked,))
        discarded, remaining = discard_matching(
            operator, {"queue": "safe.discard"}, via="api", batch=7
        )
        assert (discarded, remaining) == (25, 5)
    statuses = dict(Message.objects.filter(source_queue="safe.discard").values_list("pk", "status"))
    assert {pk for pk, status in statuses.items() if status != "discarded"} == held | {locked}
    assert Activity.objects.filter(action="discard", job=None).count() == 25

    store.release([c.item_id for c in claimed])
    store.close()
    assert discard_matching(operator, {"queue": "safe.discard"}) == (5, 0)


def test_a_job_never_sends_what_a_discard_by_filter_took_after_its_snapshot(wired, amqp, operator):
    from recovery.replay import discard_matching

    declare_app_queue(amqp, "safe.discarded")
    job, store, _messages = populated("safe.discarded", 20, operator)
    store.close()
    assert discard_matching(operator, {"queue": "safe.discarded"}) == (20, 0)
    ReplayJob.objects.filter(pk=job.pk).update(runner="")  # the snapshot's lease, given up

    assert run(job) == "done"
    assert (job.total, job.skipped, job.sent) == (20, 20, 0)
    details = set(ReplayJobItem.objects.filter(job=job).values_list("detail", flat=True))
    assert details == {"skipped: the message is discarded now"}
    assert consume_until_idle("safe.discarded") == []
