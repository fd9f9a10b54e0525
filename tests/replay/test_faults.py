"""Faults (slow, real broker and database): force-closed connections, kill -9 of the worker, a
broker outage, a real broker restart (disruptive).

What must hold in every case: every message reaches its queue at least once (counted by a real
consumer), duplicates stay within the in-flight window per disruption, and the job ends ``done``
with counts that match what the consumer saw. Sizes come from the environment so ``make test``
stays short: REPLAY_FAULT_MESSAGES (default 50000), REPLAY_OUTAGE_MESSAGES (default 5000).
"""

import os
import subprocess
import threading
import time
import urllib.parse

import pytest

from recovery.broker.management import Management
from recovery.models import Activity, Message, ReplayJob, ReplayJobItem, Status
from recovery.replay.jobs import create_job
from tests.faults import TcpProxy
from tests.helpers import declare_app_queue, wait_for
from tests.helpers.replay import consume_until_idle, dead_letters, purge_tasks, run_in_thread

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

# The issue asks for 50k; twice that keeps the job long enough for a close every ~2 s both
# before and after the takeover now that a job sends faster than it did (the management API
# also lists a new connection only after its next statistics tick, up to 5 s).
FAULT_N = int(os.environ.get("REPLAY_FAULT_MESSAGES", "100000"))
OUTAGE_N = int(os.environ.get("REPLAY_OUTAGE_MESSAGES", "5000"))
WINDOW = 1000
# Small bodies: the point is the count of messages, and filling the store is not under test.
BODY = b"f" * 200


class ConnectionCloser(threading.Thread):
    """Force-closes the replay engine's AMQP connections in this session's vhost every
    ``every`` seconds (management API; nobody else's connections are touched)."""

    def __init__(self, vhost, every=2.0):
        super().__init__(daemon=True)
        self.vhost, self.every = vhost, every
        self.management = Management()
        self.stopping = threading.Event()
        self.closed = 0

    def replay_connections(self):
        quoted = urllib.parse.quote(self.vhost, safe="")
        found = self.management.request("GET", f"/vhosts/{quoted}/connections") or []
        return [
            c["name"]
            for c in found
            if (c.get("client_properties") or {})
            .get("connection_name", "")
            .startswith("lazarus-replay")
        ]

    def run(self):
        while not self.stopping.wait(self.every):
            for name in self.replay_connections():
                try:
                    self.management.request(
                        "DELETE", f"/connections/{urllib.parse.quote(name, safe='')}"
                    )
                    self.closed += 1
                except Exception:  # noqa: BLE001 - already gone (it was reconnecting)
                    pass

    def stop(self):
        self.stopping.set()
        self.join(10)


def runner_pid(job):
    runner = ReplayJob.objects.get(pk=job.pk).runner
    return int(runner.split(":")[1]) if runner else None


def assert_every_message_arrived(job, consumer, expected_ids, disruptions):
    wait_for(
        lambda: len(consumer.seen) >= len(expected_ids),
        timeout=120,
        message="the consumer to see every message",
    )
    job.refresh_from_db()
    assert job.state == ReplayJob.State.DONE, job.progress
    assert set(consumer.seen) == expected_ids
    assert job.total == job.confirmed == len(consumer.seen) == len(expected_ids)
    duplicates = consumer.total - len(consumer.seen)
    assert duplicates <= WINDOW * disruptions, (duplicates, disruptions)
    assert not ReplayJobItem.objects.filter(job=job).exclude(state="confirmed").exists()
    assert Message.objects.filter(status=Status.REPLAYED).count() == len(expected_ids)
    return duplicates


def test_bulk_replay_survives_closed_connections_and_a_killed_worker(
    wired, amqp, operator, consumers, workers
):
    purge_tasks()
    declare_app_queue(amqp, "fault.bulk")
    messages = dead_letters("fault.bulk", FAULT_N, body=BODY)
    expected = {m.message_id for m in messages}
    consumer = consumers("fault.bulk")
    fast_takeover = {
        "REPLAY_LEASE_SECONDS": 3,
        "REPLAY_STALL_SWEEP_SECONDS": 1,
        "REPLAY_WINDOW": WINDOW,
    }
    workers(beat=True, **fast_takeover)
    pool = [workers(**fast_takeover), workers(**fast_takeover)]
    started = time.monotonic()

    # Paced to last about 30 s whatever the machine: the closes (every 2 s, seen through the
    # management API's listing, which lags by up to 5 s) must reach the worker that takes the
    # job over too. Unpaced, a quiet machine finished the last two thirds in 9 s with no close
    # of the new runner's connections (2 closes in all, and the test failed).
    job = create_job(operator, filters={"queue": "fault.bulk"}, rate=max(1, FAULT_N // 30))
    closer = ConnectionCloser(wired)
    closer.start()
    # Kill only after two forced closes: a fast job must not outrun the disruptions.
    wait_for(
        lambda: ReplayJob.objects.get(pk=job.pk).confirmed >= FAULT_N // 3 and closer.closed >= 2,
        timeout=300,
        message="a third of the job and two forced closes",
    )
    assert ReplayJob.objects.get(pk=job.pk).state == "running", "the job outran the closes"
    pid = runner_pid(job)
    [victim] = [w for w in pool if w.process.pid == pid]
    victim.kill()
    killed_at = time.monotonic()
    wait_for(
        lambda: ReplayJob.objects.get(pk=job.pk).state == "done",
        timeout=600,
        interval=0.5,
        message="the job to finish on the other worker",
    )
    closer.stop()

    duplicates = assert_every_message_arrived(job, consumer, expected, closer.closed + 1)
    assert runner_pid(job) is None
    assert Activity.objects.filter(job=job, action="job_taken_over").exists()
    print(
        f"\n{FAULT_N} messages in {time.monotonic() - started:.0f}s; "
        f"{closer.closed} forced connection closes, 1 kill -9 "
        f"(taken over {time.monotonic() - killed_at:.0f}s before the end); "
        f"{duplicates} duplicates at the consumer"
    )
    assert closer.closed >= 3


def test_a_job_rides_out_a_broker_outage(wired, amqp, operator, consumers):
    declare_app_queue(amqp, "fault.outage")
    messages = dead_letters("fault.outage", OUTAGE_N, body=BODY)
    consumer = consumers("fault.outage")
    job = create_job(operator, filters={"queue": "fault.outage"}, rate=OUTAGE_N / 10)
    reasons = set()
    with TcpProxy(5672) as proxy:
        broker_url = f"amqp://guest:guest@127.0.0.1:{proxy.port}/%2F"
        outcome = {}
        thread = run_in_thread(job, outcome, broker_url=broker_url, window=WINDOW)
        wait_for(
            lambda: ReplayJob.objects.get(pk=job.pk).confirmed >= OUTAGE_N // 4,
            timeout=120,
            message="a quarter of the job",
        )
        outage = threading.Thread(target=proxy.outage, args=(5,))
        outage.start()
        while outage.is_alive():
            reasons.add(ReplayJob.objects.get(pk=job.pk).state_reason)
            time.sleep(0.2)
        thread.join(180)

    assert outcome["r"] == "done"
    assert any(reason.startswith("waiting for RabbitMQ") for reason in reasons), reasons
    assert_every_message_arrived(job, consumer, {m.message_id for m in messages}, 1)


@pytest.mark.disruptive
def test_a_job_survives_a_real_broker_restart(wired, amqp, operator, request):
    """Restarts the shared RabbitMQ (stop_app/start_app): run alone (``-m disruptive``), never
    beside other suites."""
    declare_app_queue(amqp, "fault.restart")
    messages = dead_letters("fault.restart", OUTAGE_N, body=BODY)
    amqp.connection.close()
    job = create_job(operator, filters={"queue": "fault.restart"}, rate=OUTAGE_N / 10)
    outcome = {}
    thread = run_in_thread(job, outcome, window=WINDOW)
    wait_for(
        lambda: ReplayJob.objects.get(pk=job.pk).confirmed >= OUTAGE_N // 4,
        timeout=120,
        message="a quarter of the job",
    )
    subprocess.run(["rabbitmqctl", "stop_app"], check=True, capture_output=True)
    time.sleep(3)
    subprocess.run(["rabbitmqctl", "start_app"], check=True, capture_output=True)
    thread.join(300)

    assert outcome["r"] == "done"
    job.refresh_from_db()
    got = consume_until_idle("fault.restart", idle=2)
    ids = [props.message_id for props, _body in got]
    assert set(ids) == {m.message_id for m in messages}
    assert job.confirmed == OUTAGE_N
    assert len(ids) - len(set(ids)) <= WINDOW
