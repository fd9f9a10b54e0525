"""Lazarus on a three-node RabbitMQ cluster, with the faults a cluster exists for: the node that
leads a queue killed (-9) or stopped while messages flow through it. Counted on both sides: what
the consumer got, what the store holds, what is left in the queues.

Lazarus is pointed at node 1 with nodes 2 and 3 as RABBITMQ_NODES; it connects to node 1 first,
so node 1 leads the recovery queues that ``wire`` declares, and every fault below takes Lazarus's
own connections down with the queue leader."""

import threading
import uuid
from collections import Counter

import pika
import pytest
from django.conf import settings

from recovery.client.publisher import ReliablePublisher
from recovery.collector.consumer import start_collectors, stop_collectors
from recovery.models import Message
from tests.helpers import wait_for
from tests.helpers.replay import dead_letters, run_in_thread

# One worker starts the cluster (fixed ports) and runs all its tests (make test: --dist loadgroup).
pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.xdist_group("cluster")]

QUORUM = {"x-queue-type": "quorum"}


def declare_on(cluster, node, queue):
    """A quorum queue declared through ``node``, which then leads it."""
    channel = cluster.channel(node)
    channel.queue_delete(queue)
    channel.queue_declare(queue, durable=True, arguments=QUORUM)
    channel.connection.close()
    assert cluster.leader(queue) == node


def consume_all(cluster, queue, node, idle=2.0):
    """Every message on ``queue`` (through ``node``): Counter of message ids, acked."""
    channel = cluster.channel(node)
    channel.basic_qos(prefetch_count=2000)
    seen = Counter()
    for method, properties, _body in channel.consume(queue, inactivity_timeout=idle):
        if method is None:
            break
        seen[properties.message_id] += 1
        channel.basic_ack(method.delivery_tag, multiple=False)
    channel.cancel()
    channel.connection.close()
    return seen


class Rejecter(threading.Thread):
    """A consumer that has started failing: nacks (requeue=False) every 1,000 deliveries, so the
    broker dead-letters them while the collector drains."""

    def __init__(self, url, queue):
        super().__init__(daemon=True)
        self.url, self.queue = url, queue
        self.rejected = 0
        self.stopping = threading.Event()

    def run(self):
        channel = pika.BlockingConnection(pika.URLParameters(self.url)).channel()
        channel.basic_qos(prefetch_count=2000)
        last, pending = None, 0
        for method, _properties, _body in channel.consume(self.queue, inactivity_timeout=0.2):
            if method is not None:
                last, pending = method.delivery_tag, pending + 1
            if pending and (pending >= 1000 or method is None):
                channel.basic_nack(last, multiple=True, requeue=False)
                self.rejected += pending
                pending = 0
            if method is None and self.stopping.is_set():
                break
        channel.connection.close()


@pytest.mark.django_db(transaction=True)
def test_killing_the_dead_letter_queue_leader_mid_flood_stores_every_message_once(
    on_cluster, tmp_path
):
    cluster, n = on_cluster, 50_000
    dead_letters_queue = settings.RECOVERY_DEAD_LETTER_QUEUE
    assert cluster.leader(dead_letters_queue) == 1
    declare_on(cluster, 2, "cluster.orders")  # the application's queue: it survives
    policy = wait_for(
        lambda: (
            cluster.management().queue("/", "cluster.orders").get("effective_policy_definition")
        ),
        timeout=30,
        message="the dead-letter policy on the queue",
    )
    assert policy["dead-letter-strategy"] == "at-least-once"
    # Published with confirms (the client library's publisher, through node 2): a clean-clone
    # run once saw the queue never reach n after a fast unconfirmed publish, and the broker
    # promises nothing for a publish it never confirmed.
    publisher = ReliablePublisher(
        [cluster.url(2)], producer="cluster-fill", log_dir=tmp_path, confirm_timeout=30
    )
    try:
        for i in range(n):
            publisher.publish("", "cluster.orders", b'{"order": %d}' % i, message_id=f"flood-{i}")
    finally:
        publisher.close()
    wait_for(
        lambda: cluster.depth("cluster.orders") == n,
        timeout=120,
        message=f"the queue full ({n} confirmed publishes)",
    )

    stop_event, threads = start_collectors(flush_seconds=0.05)
    rejecter = Rejecter(cluster.url(2), "cluster.orders")
    rejecter.start()
    try:
        wait_for(lambda: Message.objects.count() >= n // 5, timeout=120, message="a fifth stored")
        cluster.kill(1)  # leads recovery.dead_letters; Lazarus's connections are on it too
        wait_for(
            lambda: Message.objects.count() >= n,
            timeout=300,
            interval=1,
            message=f"{n} stored after the kill",
        )
    finally:
        rejecter.stopping.set()
        rejecter.join(30)
        stop_collectors(stop_event, threads)

    assert rejecter.rejected == n
    assert Message.objects.count() == n
    assert Message.objects.values("message_id").distinct().count() == n
    assert cluster.depth(dead_letters_queue) == 0  # none left behind
    assert cluster.depth(settings.RECOVERY_QUARANTINE_QUEUE) == 0
    assert cluster.depth("cluster.orders") == 0
    assert cluster.leader(dead_letters_queue) in (2, 3)


@pytest.mark.django_db(transaction=True)
def test_stopping_the_target_queue_leader_mid_job_delivers_every_message(on_cluster, operator):
    from recovery.replay.jobs import create_job

    cluster, n = on_cluster, 20_000
    declare_on(cluster, 3, "cluster.target")
    stored = dead_letters("cluster.target", n)
    job = create_job(operator, filters={"queue": "cluster.target"})
    outcome = {}
    runner = run_in_thread(job, outcome)
    wait_for(lambda: cluster.depth("cluster.target") >= n // 5, timeout=120, message="a fifth")
    cluster.stop(3)
    runner.join(600)
    assert not runner.is_alive(), "the job did not end"
    job.refresh_from_db()
    assert job.state == "done", (job.state, job.state_reason)
    assert job.confirmed == n, (job.confirmed, job.failed, job.skipped)

    cluster.heal()
    seen = consume_all(cluster, "cluster.target", node=1)
    assert set(seen) == {m.message_id for m in stored}  # every message delivered
    duplicates = sum(seen.values()) - n
    # At least once: a publish unconfirmed when the leader went is sent again; no more than a
    # window of them.
    assert 0 <= duplicates <= settings.REPLAY_WINDOW, duplicates


def test_a_reliable_publisher_loses_nothing_when_its_node_is_killed(on_cluster, tmp_path):
    cluster, n = on_cluster, 50_000
    declare_on(cluster, 2, "cluster.client")
    publisher = ReliablePublisher(
        cluster.urls(), producer="cluster-test", log_dir=tmp_path, confirm_timeout=5
    )
    ids = [f"p-{uuid.uuid4().hex[:12]}-{i}" for i in range(n)]
    try:
        for i, message_id in enumerate(ids):
            if i == n // 5:
                threading.Thread(target=cluster.kill, args=(1,), daemon=True).start()
            publisher.publish("", "cluster.client", b"payload", message_id=message_id)
    finally:
        publisher.close()

    delivered = consume_all(cluster, "cluster.client", node=2)
    given_up = consume_all(cluster, settings.RECOVERY_RETURNS_QUEUE, node=2)
    assert publisher.connections >= 2  # it did fail over
    missing = set(ids) - set(delivered) - set(given_up)
    assert not missing, f"{len(missing)} lost, e.g. {sorted(missing)[:3]}"
    assert set(delivered) | set(given_up) <= set(ids)


def test_the_firehose_of_every_node_is_collected_and_a_restart_is_a_trace_gap(
    on_cluster, tmp_path, settings
):
    """#48: tracing on for / through the management API, the tap consuming through node 1: a
    publish through each node and a delivery through node 3 are each a record naming its node;
    node 2 killed (-9) and started again is a ``node_restart`` trace_gap, and after it the tap
    has tracing on again there (node state a new VM does not have): its next publish is traced
    too."""
    from recovery.broker import trace
    from recovery.broker.trace_tap import start_taps, stop_taps

    cluster = on_cluster
    settings.AUDIT_TRACE = str(tmp_path / "trace")
    settings.TRACE_FLUSH_SECONDS = 0.3
    management = cluster.management()
    trace.wire_trace("/", True, management)
    declare_on(cluster, 2, "cluster.orders")
    stop_event, threads = start_taps(["/"], flush_seconds=0.3)

    def nodes_of(kind, prefix):
        return {
            r["node"]
            for r in trace.read_records(kind=kind)
            if (r["message_id"] or "").startswith(prefix)
        }

    names = sorted(n["name"] for n in management.request("GET", "/nodes?columns=name"))
    assert [n.split("@")[0] for n in names] == ["lazarus-c1", "lazarus-c2", "lazarus-c3"]
    try:
        for node in (1, 2, 3):
            channel = cluster.channel(node)
            channel.basic_publish(
                "", "cluster.orders", b"x", pika.BasicProperties(message_id=f"t-{node}")
            )
            channel.connection.close()
        consume_all(cluster, "cluster.orders", node=3)
        every = set(names)
        wait_for(
            lambda: nodes_of("publish", "t-") == every, timeout=30, message="3 nodes' publishes"
        )
        wait_for(lambda: nodes_of("deliver", "t-") == {names[2]}, timeout=30)

        cluster.kill(2)
        cluster.heal()
        wait_for(
            lambda: any(r["kind"] == "node_restart" for r in trace.read_coverage()),
            timeout=60,
            message="the tap to see node 2 restart",
        )
        [restart] = [r for r in trace.read_coverage() if r["kind"] == "node_restart"]
        assert restart["node"] == names[1]
        gaps = trace.coverage_gaps("/", restart["from_ms"] - 1, trace.now_ms())
        assert [g["node"] for g in gaps if g["kind"] == "node_restart"] == [restart["node"]]

        def publish_through_2():
            channel = cluster.channel(2)
            channel.basic_publish(
                "", "cluster.orders", b"y", pika.BasicProperties(message_id="after-2")
            )
            channel.connection.close()
            return nodes_of("publish", "after-2")

        # Tracing back on node 2 (the tap turned it on again): its publish is a record.
        wait_for(lambda: publish_through_2() == {names[1]}, timeout=30)
    finally:
        stop_taps(stop_event, threads)
        trace.set_tracing("/", False, management)
        channel = cluster.channel(1)
        channel.queue_delete(settings.RECOVERY_TRACE_QUEUE)
        channel.connection.close()
