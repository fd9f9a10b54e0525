"""Bulk replay speed against the raw async-confirm publish, and a rate-limited job's accuracy.

    .venv/bin/python bench/replay.py [N]          # default 100000
    options: --rate-messages M (default 10000) --rate R (default 500) --skip-rate
             --realistic-bodies (varied JSON bodies instead of the baseline's b"x" * 1024)

1. Stores N dead letters of 1 KiB (the baseline's body) in a private database, exactly as the
   collector stores them (COPY), for a private vhost's queue ``bench.replay``.
2. Runs ``async_confirm(N)`` from bench/baselines/broker_baseline.py (pika, window 1000,
   persistent 1 KiB messages to a durable queue) in its own private vhost.
3. Creates a replay job for the N messages at unlimited rate and runs it in this process with
   the engine a Celery worker uses (``JobRunner``); times it from start (including the snapshot
   of the selection) to ``done``, and the sending alone (first to last confirm recorded).
   Prints ``replay / baseline`` (target >= 0.7), and for both the CPU per message of this
   process, PostgreSQL and RabbitMQ (bench/_cpu.py): the figure load on the machine disturbs
   least.
4. A job of M messages at R msgs/s; a consumer timestamps each arrival; prints the achieved rate
   (first to last arrival) and its deviation (target within +-5 %).

Private vhosts ``lazarus-bench-replay-<pid>*`` and database BENCH_DATABASE_URL (default
``postgresql://postgres@127.0.0.1:5432/lazarus_bench_replay``), created here; the vhosts are
deleted at the end. Prints, never asserts.
"""

import argparse
import importlib.util
import json
import os
import random
import string
import sys
import threading
import time
import urllib.parse
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench._django import setup_django  # noqa: E402

BENCH_DB = setup_django("lazarus_bench_replay", LOG_LEVEL="WARNING")

import pika  # noqa: E402
import psycopg  # noqa: E402
from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db.models import Max, Min  # noqa: E402

from bench._cpu import CpuMeter  # noqa: E402
from recovery.broker.management import Management  # noqa: E402
from recovery.broker.topology import wire  # noqa: E402
from recovery.collector.insert import store_rows  # noqa: E402
from recovery.collector.rows import delivery_to_row  # noqa: E402
from recovery.db import database_conninfo  # noqa: E402
from recovery.models import ReplayAttempt  # noqa: E402
from recovery.replay.jobs import create_job  # noqa: E402
from recovery.replay.runner import JobRunner  # noqa: E402

BASELINE = Path(__file__).resolve().parent / "baselines" / "broker_baseline.py"
BODY = b"x" * 1024
QUEUE = "bench.replay"
RATE_QUEUE = "bench.rate"


def ensure_database():
    parsed = urllib.parse.urlparse(BENCH_DB)
    admin = parsed._replace(path="/postgres").geturl()
    with psycopg.connect(admin, autocommit=True) as pg:
        name = parsed.path.lstrip("/")
        if not pg.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            pg.execute(f'CREATE DATABASE "{name}"')
    call_command("migrate", verbosity=0, skip_checks=True)


def vhost_url(vhost):
    base = urllib.parse.urlparse(settings.RABBITMQ_URL)
    return base._replace(path="/" + urllib.parse.quote(vhost, safe="")).geturl()


def make_vhost(management, vhost):
    management.put_vhost(vhost)
    management.grant(vhost, urllib.parse.urlparse(settings.RABBITMQ_URL).username or "guest")


def realistic_body(rnd, i):
    order = {
        "order": i,
        "customer": "".join(rnd.choices(string.ascii_letters, k=24)),
        "lines": [
            {"sku": "".join(rnd.choices(string.ascii_uppercase + string.digits, k=10)), "q": 1}
            for _ in range(30)
        ],
    }
    return json.dumps(order).encode()[:1024].ljust(1024, b" ")


def fill(vhost, queue, n, realistic):
    """N stored dead letters of ``queue``, as the collector writes them."""
    rnd = random.Random(n)
    started = time.perf_counter()
    with psycopg.connect(database_conninfo(), autocommit=True) as pg:
        rows = []
        for i in range(n):
            body = realistic_body(rnd, i) if realistic else BODY
            properties = pika.BasicProperties(
                message_id=f"{queue}-{i}",
                delivery_mode=2,
                headers={
                    "x-death": [
                        {
                            "count": 1,
                            "reason": "rejected",
                            "queue": queue,
                            "exchange": "",
                            "routing-keys": [queue],
                        }
                    ]
                },
            )
            rows.append(
                delivery_to_row(
                    vhost, "recovery.dead_letters", "recovery.dlx", queue, properties, body
                )
            )
            if len(rows) == 5000:
                store_rows(pg, rows)
                rows = []
        store_rows(pg, rows)
        pg.execute("VACUUM ANALYZE recovery_message")
        backend = pg.info.backend_pid
    rate = n / (time.perf_counter() - started)
    wait_for_backend_exit(backend)
    return rate


def wait_for_backend_exit(pid):
    """The CPU of an exited backend reaches the postmaster's account when it is reaped: wait
    for the fill's backend to be gone, or its seconds of COPY land in the baseline's figure."""
    with psycopg.connect(database_conninfo(), autocommit=True) as pg:
        for _ in range(100):
            if not pg.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone():
                break
            time.sleep(0.05)
    time.sleep(0.2)


def declare(vhost, queue):
    connection = pika.BlockingConnection(pika.URLParameters(vhost_url(vhost)))
    channel = connection.channel()
    channel.queue_delete(queue)
    channel.queue_declare(queue, durable=True)
    connection.close()


def run_baseline(n, management):
    vhost = f"lazarus-bench-replay-{os.getpid()}-baseline"
    make_vhost(management, vhost)
    os.environ["RABBITMQ_URL"] = vhost_url(vhost)
    try:
        spec = importlib.util.spec_from_file_location("broker_baseline", BASELINE)
        baseline = importlib.util.module_from_spec(spec)
        # It reads sys.argv[1] as its own N when imported: give it ours, not our options.
        argv, sys.argv = sys.argv, [str(BASELINE), str(n)]
        try:
            spec.loader.exec_module(baseline)
        finally:
            sys.argv = argv
        rate, _queue = baseline.async_confirm(n)
        return rate
    finally:
        management.delete_vhost(vhost)


def run_replay(queue):
    job = create_job(None, filters={"queue": queue}, via="system")
    started = time.perf_counter()
    outcome = JobRunner(job.pk, job.token).run(wait_for_lease=False)
    elapsed = time.perf_counter() - started
    job.refresh_from_db()
    span = ReplayAttempt.objects.filter(job=job).aggregate(a=Min("created_at"), b=Max("created_at"))
    sending = (span["b"] - span["a"]).total_seconds() if span["a"] else float("nan")
    return job, outcome, elapsed, sending


class ArrivalClock(threading.Thread):
    def __init__(self, vhost, queue, expect):
        super().__init__(daemon=True)
        self.url, self.queue, self.expect = vhost_url(vhost), queue, expect
        self.times = []

    def run(self):
        connection = pika.BlockingConnection(pika.URLParameters(self.url))
        channel = connection.channel()
        channel.basic_qos(prefetch_count=500)
        for method, _props, _body in channel.consume(self.queue, inactivity_timeout=30):
            if method is None:
                break
            self.times.append(time.perf_counter())
            channel.basic_ack(method.delivery_tag)
            if len(self.times) >= self.expect:
                break
        channel.cancel()
        connection.close()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("n", nargs="?", type=int, default=100_000)
    parser.add_argument("--rate-messages", type=int, default=10_000)
    parser.add_argument("--rate", type=float, default=500.0)
    parser.add_argument("--skip-rate", action="store_true")
    parser.add_argument("--realistic-bodies", action="store_true")
    args = parser.parse_args()

    ensure_database()
    management = Management()
    vhost = f"lazarus-bench-replay-{os.getpid()}"
    make_vhost(management, vhost)
    settings.RABBITMQ_URL = vhost_url(vhost)
    settings.RECOVERY_VHOSTS = [vhost]
    try:
        wire(vhost)
        with psycopg.connect(BENCH_DB, autocommit=True) as pg:
            # Every run starts from the same store: job items, attempts and activity rows carry
            # no database foreign keys (migration 0013), so CASCADE would leave the previous
            # runs' rows behind, and each run would write into bigger indexes than the last.
            pg.execute(
                "TRUNCATE recovery_message, recovery_replayjob, recovery_replayjobitem, "
                "recovery_replayattempt, recovery_activity CASCADE"
            )
        declare(vhost, QUEUE)
        print(f"filling the store with {args.n} dead letters of 1 KiB ...", flush=True)
        print(f"  stored at {fill(vhost, QUEUE, args.n, args.realistic_bodies):.0f} rows/s")

        with CpuMeter() as base_cpu:
            base = run_baseline(args.n, management)
        print(f"baseline async-confirm publish  {base:9.0f} msg/s", flush=True)
        print(f"  CPU per message: {base_cpu.per_message(args.n)}")
        with CpuMeter() as replay_cpu:
            job, outcome, elapsed, sending = run_replay(QUEUE)
        replay = job.confirmed / elapsed
        print(
            f"replay job (start to done)      {replay:9.0f} msg/s  "
            f"({job.confirmed} confirmed in {elapsed:.1f}s, {outcome})"
        )
        print(f"  CPU per message: {replay_cpu.per_message(job.confirmed)}")
        print(f"replay job (sending only)       {job.confirmed / sending:9.0f} msg/s")
        print(f"replay / baseline               {replay / base:9.2f}   (target >= 0.7)")

        if not args.skip_rate:
            declare(vhost, RATE_QUEUE)
            fill(vhost, RATE_QUEUE, args.rate_messages, args.realistic_bodies)
            clock = ArrivalClock(vhost, RATE_QUEUE, args.rate_messages)
            clock.start()
            job = create_job(None, filters={"queue": RATE_QUEUE}, rate=args.rate, via="system")
            JobRunner(job.pk, job.token).run(wait_for_lease=False)
            clock.join(60)
            times = clock.times
            achieved = (len(times) - 1) / (times[-1] - times[0])
            print(
                f"rate-limited job at {args.rate:g} msg/s: achieved {achieved:.1f} msg/s "
                f"({100 * (achieved / args.rate - 1):+.1f}%, {len(times)} messages, "
                "target within +-5%)"
            )
    finally:
        management.delete_vhost(vhost)


if __name__ == "__main__":
    main()
