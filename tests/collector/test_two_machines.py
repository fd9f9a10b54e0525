"""Two collectors on two machines: two real Celery workers, each in a UTS namespace of its own
(``unshare --uts``: its own host name, as on another machine) and with its own environment, drain
one dead-letter flood together. No row is stored twice, both do part of the work, and the
console's collector page names both machines."""

import os
import shutil

import pika
import pytest
from django.conf import settings

from recovery.models import CollectorHeartbeat, Message
from tests.helpers import WorkerProcess, wait_for

pytestmark = [pytest.mark.slow]

MACHINES = {
    # host name: what differs in its environment besides the host name
    "collector-machine-a": {"COLLECTOR_WRITERS": "1", "COLLECTOR_PREFETCH": "500", "TZ": "UTC"},
    "collector-machine-b": {
        "COLLECTOR_WRITERS": "2",
        "COLLECTOR_PREFETCH": "2000",
        "TZ": "Asia/Tokyo",
    },
}


def start_worker(hostname, extra_env, log_path):
    args = [
        "worker", "--collector", "--pool", "solo", "-l", "warning", "-n", f"lazarus@{hostname}",
        "-Q", f"lazarus.tasks.{os.getpid()}.{hostname}",
    ]  # fmt: skip
    # In a UTS namespace of its own, under its own host name: as on another machine.
    prefix = ["unshare", "--uts", "sh", "-c", f'hostname "{hostname}" && exec "$@"', "sh"]
    return WorkerProcess(log_path, args, prefix, COLLECTOR_PROCESSES="1", **extra_env).start()


@pytest.mark.skipif(not shutil.which("unshare"), reason="needs unshare (util-linux)")
@pytest.mark.usefixtures("wired", "clean_queues", "transactional_db")
def test_two_collectors_on_two_machines_share_a_flood_and_store_each_message_once(
    tmp_path, client, viewer
):
    n = 20_000
    workers = [start_worker(host, env, tmp_path / f"{host}.log") for host, env in MACHINES.items()]
    try:
        wait_for(
            lambda: (
                {
                    hb.worker.split(":")[0]
                    for hb in CollectorHeartbeat.objects.filter(
                        queue=settings.RECOVERY_DEAD_LETTER_QUEUE
                    )
                }
                >= set(MACHINES)
            ),
            timeout=90,
            interval=0.5,
            message="both machines' collectors to beat",
        )
        channel = pika.BlockingConnection(pika.URLParameters(settings.RABBITMQ_URL)).channel()
        channel.queue_delete("app.two-machines")
        channel.queue_declare(
            "app.two-machines",
            arguments={"x-dead-letter-exchange": settings.RECOVERY_DLX, "x-message-ttl": 0},
        )
        for i in range(n):
            channel.basic_publish(
                "",
                "app.two-machines",
                b'{"n": %d}' % i,
                pika.BasicProperties(message_id=f"two-{i}"),
            )
        channel.connection.close()
        wait_for(
            lambda: Message.objects.filter(source_queue="app.two-machines").count() >= n,
            timeout=180,
            interval=0.5,
            message=f"{n} stored",
        )
        # The heartbeats carry each thread's running count; wait for the last one to be written.
        wait_for(
            lambda: (
                sum(
                    hb.collected
                    for hb in CollectorHeartbeat.objects.filter(
                        queue=settings.RECOVERY_DEAD_LETTER_QUEUE,
                        worker__regex=r"^collector-machine-[ab]:",
                    )
                )
                >= n
            ),
            timeout=30,
            message="the heartbeats to count every message",
        )
        client.force_login(viewer)
        page = client.get("/overview/live").content.decode()
    finally:
        for worker in workers:
            worker.stop()

    stored = Message.objects.filter(source_queue="app.two-machines")
    assert stored.count() == n
    assert stored.values("message_id").distinct().count() == n
    by_machine = {}
    for hb in CollectorHeartbeat.objects.filter(queue=settings.RECOVERY_DEAD_LETTER_QUEUE):
        host = hb.worker.split(":")[0]
        by_machine[host] = by_machine.get(host, 0) + hb.collected
    assert set(by_machine) >= set(MACHINES)
    assert all(by_machine[host] > 0 for host in MACHINES), by_machine  # both busy
    assert sum(by_machine[host] for host in MACHINES) == n  # nothing counted twice
    assert 'id="collector-workers"' in page
    assert all(host in page for host in MACHINES)
