"""A real three-node RabbitMQ cluster beside the default node (scripts/rabbitmq-cluster.sh):
started once per test process that runs this package, pointed at by the settings of each test,
its nodes killed and stopped by the tests and brought back after each."""

import re
import subprocess
from pathlib import Path

import pika
import pytest

from recovery.broker.management import Management
from recovery.broker.topology import Names, wire

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "rabbitmq-cluster.sh"
NODES = (1, 2, 3)


def script(*args):
    done = subprocess.run(
        [str(SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=300
    )
    if done.returncode:
        raise AssertionError(f"{SCRIPT.name} {' '.join(map(str, args))}: {done.stderr[-2000:]}")
    return done.stdout


class Cluster:
    management_url = "http://guest:guest@127.0.0.1:15701"

    def __init__(self):
        self.down = set()

    @staticmethod
    def url(node):
        return f"amqp://guest:guest@127.0.0.1:570{node}/%2F"

    def urls(self):
        return [self.url(n) for n in NODES]

    def management(self, node=None):
        alive = node or next(n for n in NODES if n not in self.down)
        return Management(url=f"http://guest:guest@127.0.0.1:1570{alive}", timeout=30)

    def channel(self, node):
        return pika.BlockingConnection(pika.URLParameters(self.url(node))).channel()

    def leader(self, queue):
        """The node number leading a quorum queue of vhost /."""
        info = self.management().queue("/", queue)
        name = info.get("leader") or info.get("node") or ""
        match = re.match(r"lazarus-c(\d)@", name)
        assert match, f"no leader for {queue}: {info}"
        return int(match.group(1))

    def depth(self, queue, node=None):
        """Messages in ``queue`` now (AMQP passive declare, not the management API's 5 s view)."""
        alive = node or next(n for n in NODES if n not in self.down)
        channel = self.channel(alive)
        try:
            return channel.queue_declare(queue, passive=True).method.message_count
        finally:
            channel.connection.close()

    def kill(self, node):
        script("kill", node)
        self.down.add(node)

    def stop(self, node):
        script("stop-node", node)
        self.down.add(node)

    def heal(self):
        for node in sorted(self.down):
            script("start-node", node)
        self.down.clear()


# Session-scoped, not package: under pytest-xdist a worker may run other packages' tests between
# this package's, and a package fixture would stop and start the cluster each time (a restart
# that raced the stop failed once). make test sends all of them to one worker (xdist_group).
@pytest.fixture(scope="session")
def cluster():
    script("stop")  # what an interrupted run left behind
    script("start")
    yield Cluster()
    script("stop")


@pytest.fixture
def on_cluster(cluster, settings):
    """Lazarus pointed at the cluster (node 1 first, then 2 and 3) and wired there; every node
    up again after the test."""
    settings.RABBITMQ_URL = cluster.url(1)
    settings.RABBITMQ_NODES = ["127.0.0.1:5702", "127.0.0.1:5703"]
    settings.RABBITMQ_MANAGEMENT_URL = cluster.management_url
    settings.RECOVERY_VHOSTS = ["/"]
    # Application queues named cluster.* dead-letter to Lazarus, at least once.
    wire("/", queues_regex=r"cluster\..*", at_least_once=True)
    names = Names.from_settings()
    channel = cluster.channel(1)
    for queue in (*names.source_queues, names.quarantine):
        channel.queue_purge(queue)
    channel.connection.close()
    try:
        yield cluster
    finally:
        cluster.heal()
        for queue in ("cluster.orders", "cluster.target", "cluster.client"):
            channel = cluster.channel(1)
            channel.queue_delete(queue)
            channel.connection.close()
