"""A collector worker with extra collector processes (COLLECTOR_PROCESSES): they consume beside
the worker's own threads, come back when one dies, stop with the worker and die with it."""

import os
import signal
import time

import pika
import pytest

from recovery.collector.processes import collector_process_count
from recovery.models import CollectorHeartbeat
from tests.helpers import wait_for
from tests.helpers.collector import fill, open_channel, stored_count

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]  # real Celery workers

N = 3000


def children(pid):
    """Running child processes of ``pid`` (from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(entry))
    return found


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def consumers(vhost, queue="recovery.dead_letters"):
    channel = open_channel(vhost)
    try:
        return channel.queue_declare(queue, passive=True).method.consumer_count
    finally:
        channel.connection.close()


def test_zero_means_one_per_core_and_a_number_is_that_number():
    assert collector_process_count(3) == 3
    assert collector_process_count(0) == len(os.sched_getaffinity(0))


def test_extra_processes_consume_and_store_beside_the_worker(worker_process, wired):
    worker = worker_process(COLLECTOR_PROCESSES="3").start()
    wait_for(lambda: len(children(worker.process.pid)) == 2, timeout=30, message="2 children")
    wait_for(lambda: consumers(wired) == 3, timeout=60, message="3 consumers on the DLQ")
    fill(wired, "procs.app", N, wait=False)
    wait_for(lambda: stored_count("procs.app") == N, timeout=120, message=f"{N} stored")
    # Every process heartbeats its own rows, so /healthz sees three collectors per source.
    pids = {worker.process.pid, *children(worker.process.pid)}
    beats = wait_for(
        lambda: (
            rows
            if len(
                rows := set(
                    CollectorHeartbeat.objects.filter(
                        queue="recovery.dead_letters", vhost=wired
                    ).values_list("worker", flat=True)
                )
            )
            == 3
            else None
        ),
        timeout=30,
        message="three heartbeating collectors",
    )
    assert {int(w.rsplit(":", 1)[1]) for w in beats} == pids


def test_a_dead_collector_process_is_started_again(worker_process, wired):
    worker = worker_process(COLLECTOR_PROCESSES="2").start()
    first = wait_for(lambda: children(worker.process.pid), timeout=30, message="a child")[0]
    os.kill(first, signal.SIGKILL)
    again = wait_for(
        lambda: [c for c in children(worker.process.pid) if c != first],
        timeout=30,
        message="the child started again",
    )
    assert len(again) == 1
    wait_for(lambda: consumers(wired) == 2, timeout=60, message="2 consumers again")
    fill(wired, "procs.again", 500, wait=False)
    wait_for(lambda: stored_count("procs.again") == 500, timeout=60, message="500 stored")


def test_a_warm_shutdown_stops_them_and_kill_9_takes_them_along(worker_process, wired):
    worker = worker_process(COLLECTOR_PROCESSES="2").start()
    child = wait_for(lambda: children(worker.process.pid), timeout=30, message="a child")[0]
    wait_for(lambda: consumers(wired) == 2, timeout=60, message="2 consumers")
    worker.stop()  # SIGTERM
    assert worker.process.returncode == 0, worker.log()
    wait_for(lambda: not alive(child), timeout=10, message="the child gone after SIGTERM")

    worker = worker_process(COLLECTOR_PROCESSES="2").start()
    child = wait_for(lambda: children(worker.process.pid), timeout=30, message="a child")[0]
    wait_for(lambda: consumers(wired) == 2, timeout=60, message="2 consumers")
    worker.kill()  # SIGKILL: no shutdown code runs in the worker
    wait_for(lambda: not alive(child), timeout=10, message="the child gone with its parent")
    # Nobody is left consuming: an orphan would keep taking deliveries.
    wait_for(lambda: consumers(wired) == 0, timeout=30, message="no consumer left")
    time.sleep(0.5)
    channel = open_channel(wired)
    channel.basic_publish("", "recovery.dead_letters", b"x", pika.BasicProperties())
    time.sleep(1)
    assert channel.queue_declare("recovery.dead_letters", passive=True).method.message_count == 1
    channel.connection.close()
