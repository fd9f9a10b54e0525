"""The audit on a Spark standalone cluster (issue #19): a master and two workers started from the
pyspark distribution on this machine, each worker with a work directory of its own (its
executors run there, as on other machines), and `manage.py audit --master spark://…` gives the
same totals and evidence as `local[1]` on the same day."""

import datetime
import io
import json
import os
import re
import subprocess
import time
import urllib.request
from pathlib import Path

import pyspark
import pytest
from django.core.management import call_command

from recovery.models import AuditEvidence, AuditRun, Message
from tests.helpers import free_port
from tests.helpers.audit import BINDINGS, DAY, consumed, produced, write_log

pytestmark = [pytest.mark.spark, pytest.mark.slow]

SPARK_CLASS = str(Path(pyspark.__file__).parent / "bin" / "spark-class")


def alive_workers(ui_port):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=2) as resp:
            return json.load(resp).get("aliveworkers", 0)
    except OSError:
        return 0


@pytest.fixture(scope="module")
def standalone(tmp_path_factory):
    """spark://127.0.0.1:<port> with two one-core workers; stopped at the end."""
    base = tmp_path_factory.mktemp("spark-cluster")
    port, ui = free_port(), free_port()
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_NO_DAEMONIZE": "1"}
    processes = []

    def start(name, *args):
        log = open(base / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        processes.append(
            (
                subprocess.Popen(
                    [SPARK_CLASS, *args],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=base,
                ),
                log,
            )
        )

    start(
        "master",
        "org.apache.spark.deploy.master.Master",
        *("--host", "127.0.0.1", "--port", str(port), "--webui-port", str(ui)),
    )
    for n in (1, 2):
        work = base / f"worker{n}"
        work.mkdir()
        start(
            f"worker{n}",
            "org.apache.spark.deploy.worker.Worker",
            f"spark://127.0.0.1:{port}",
            *("--cores", "1", "--memory", "1g", "--work-dir", str(work)),
            *("--host", "127.0.0.1", "--webui-port", str(free_port())),
        )
    deadline = time.monotonic() + 90
    while alive_workers(ui) < 2:
        if time.monotonic() > deadline or any(p.poll() is not None for p, _ in processes):
            logs = "\n".join(
                (base / f"{n}.log").read_text(errors="replace")[-1500:]
                for n in ("master", "worker1", "worker2")
            )
            for p, _ in processes:
                p.kill()
            pytest.fail(f"the standalone cluster did not come up:\n{logs}")
        time.sleep(0.5)
    yield {"url": f"spark://127.0.0.1:{port}", "ui": ui, "base": base}
    for p, log in processes:
        p.terminate()
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()
        log.close()


def day_of_logs(base, n=400):
    """A day with every kind of outcome: delivered, retried, duplicated, dead-lettered, lost."""
    producer, consumer = [], []
    for i in range(n):
        mid = f"m-{i}"
        if i % 10 == 3:
            producer.append(produced(mid, attempt=1, outcome="timeout", dt=i))
            producer.append(produced(mid, attempt=2, outcome="ack", dt=i + 5))
        else:
            producer.append(produced(mid, dt=i))
        if i % 25 == 7:
            continue  # lost: nobody consumed it, nothing in the store
        if i % 25 == 11:
            continue  # dead-lettered: in the store (below)
        consumer.append(consumed(mid, dt=i + 50))
        if i % 20 == 1:
            consumer.append(consumed(mid, dt=i + 90, redelivered=True))
    write_log(base, "producer", 10, "shop-api-host-1", producer[: n // 2])
    write_log(base, "producer", 10, "shop-api-host-2", producer[n // 2 :])
    write_log(base, "consumer", 10, "billing-host-1", consumer)
    (base / "bindings.json").write_text(json.dumps(BINDINGS))
    for i in range(n):
        if i % 25 == 11:
            Message.objects.create(
                kind="dead_letter",
                reason="rejected",
                source_queue="billing.orders",
                source_exchange="shop",
                routing_keys=["order.created"],
                message_id=f"m-{i}",
                body=b"",
                body_size=0,
                fingerprint=f"fp-{i}",
                group_key="g",
                collected_at=datetime.datetime(2026, 11, 20, 10, 0, 2, tzinfo=datetime.UTC),
            )


def audit(base, master, settings):
    settings.AUDIT_BINDINGS = str(base / "bindings.json")
    out = io.StringIO()
    call_command(
        "audit",
        *("--date", DAY.isoformat(), "--now", "2026-11-22T00:00:00", "--master", master),
        *("--producer-logs", str(base / "producer"), "--consumer-logs", str(base / "consumer")),
        stdout=out,
    )
    run = AuditRun.objects.filter(date=DAY).order_by("-revision").first()
    assert run.status == "succeeded", run.error
    evidence = sorted(
        AuditEvidence.objects.filter(run=run).values_list("kind", "message_id", "consumer_group")
    )
    return run, evidence


@pytest.mark.django_db(transaction=True)
def test_a_standalone_cluster_audits_the_day_as_local_does(standalone, tmp_path, settings):
    day_of_logs(tmp_path)
    local, local_evidence = audit(tmp_path, "local[1]", settings)
    cluster, cluster_evidence = audit(tmp_path, standalone["url"], settings)

    assert cluster.totals == local.totals
    assert cluster_evidence == local_evidence
    assert local.totals["lost"] == 16 and local.totals["dead_lettered"] == 16
    assert {kind for kind, _, _ in local_evidence} >= {"lost", "duplicate"}
    # The work really ran on the workers: each ran an executor for the job, in its own folder.
    for n in (1, 2):
        apps = list((standalone["base"] / f"worker{n}").iterdir())
        assert apps, f"worker{n} ran no executor"
        assert any(re.match(r"app-", p.name) for p in apps)
