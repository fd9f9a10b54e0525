"""Collector drain speed against the raw baseline, and the collector's memory on a long drain.

    .venv/bin/python bench/collector.py [N]           # default 100000
    .venv/bin/python bench/collector.py --rss 1000000  # peak RSS while draining 1M messages
    options: --skip-baseline, --as-run (the worker as `make run` starts it, beat included),
             --rss-only, --in-process (SourceCollector threads instead of a
             real ``celery -A console worker --collector`` process), --prefetch P --batch B

Drain: fills ``recovery.dead_letters`` with N real 1 KiB dead letters (published to an app queue
with ``x-message-ttl: 0`` that dead-letters to ``recovery.dlx``, the way the baseline fills its
DLQ), then starts a real Celery worker with the collector and times the drain into the store.
The timer starts at the first stored row once every collector process of the worker consumes
from the queue (the worker's own threads start a second or so before the extra processes it
spawns, ``COLLECTOR_PROCESSES``), so start-up (Django, Celery) is not counted — the baseline does
not count its imports either; the rate printed is the one a running collector drains at.
Then runs ``bench/baselines/drain_baseline.py`` with the same N in a subprocess, against its
own vhost and database, and prints ``collector / baseline``. With ``--rounds R`` (default 2)
the pair runs R times, alternating, and the ratio uses the best of each (load from other
processes only ever slows a run down). Prints, never asserts; also the CPU per message of the
collector processes and of their PostgreSQL backends against the baseline's, which load on
the machine disturbs far less than the rates.

After each drain the search indexer (recovery.search.index) indexes the drained rows and its
rate is printed: the collector no longer pays for the trigram search index, the indexer does,
right behind it (Celery beat), so this is the rate at which search catches up with a drain.

Race (``--race [N]``, default 30,000): the case operators live through. An application queue
holds N 1 KiB messages; a consumer that starts failing takes them and
``basic.nack(multiple=True, requeue=False)``s every 1,000 (bench/_race.py), so the broker
dead-letters *while* the collector drains. The clock starts with the rejecter and stops when the
store holds all N. The raw contestant is raced the same way on a quorum DLQ of its own (the raw
drainer of drain_baseline.py, as its own process), in the same run; prints each round's ``race
ratio``, their median and the best of each side (``--race --as-run --rounds 5``: the median of
five the issue asks for).

RSS: fills N (default 1M) dead letters, drains them with one worker process and prints its
resident set size every few seconds, then the peak.

Into a big store (``--stored URL``, issue #34): the same drain into the store of that database
as it is (the one ``bench/ui.py N`` loads; the drained rows are deleted afterwards) and into an
empty one, alternating, ``--rounds`` pairs: ``stored / empty`` per round, median and best.
Index maintenance grows with the table; this measures by how much.

Everything runs in private vhosts (``lazarus-bench-<pid>``) and a private database
(BENCH_DATABASE_URL, default ``postgresql://postgres@127.0.0.1:5432/lazarus_bench_collector``),
all created here and the vhosts deleted at the end.
"""

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench._django import setup_django  # noqa: E402

BENCH_DB = setup_django("lazarus_bench_collector")

import pika  # noqa: E402
import psycopg  # noqa: E402
from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402

from bench._cpu import cpu_seconds, process_tree, tree_cpu_seconds  # noqa: E402
from recovery.broker.management import Management  # noqa: E402
from recovery.broker.topology import wire  # noqa: E402
from recovery.collector.processes import collector_process_count  # noqa: E402

BASELINE = Path(__file__).resolve().parent / "baselines" / "drain_baseline.py"
BODY = b"x" * 1024
APP_QUEUE = "bench.work"
DLQ = "recovery.dead_letters"


def ensure_database():
    parsed = urllib.parse.urlparse(BENCH_DB)
    name = parsed.path.lstrip("/")
    admin = parsed._replace(path="/postgres").geturl()
    with psycopg.connect(admin, autocommit=True) as pg:
        if not pg.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            pg.execute(f'CREATE DATABASE "{name}"')
    call_command("migrate", verbosity=0)


def vhost_url(vhost):
    base = urllib.parse.urlparse(settings.RABBITMQ_URL)
    return base._replace(path="/" + urllib.parse.quote(vhost, safe="")).geturl()


def make_vhost(management, vhost):
    management.put_vhost(vhost)
    management.grant(vhost, urllib.parse.urlparse(settings.RABBITMQ_URL).username or "guest")


def fill(vhost, n):
    """Put N real dead letters in the vhost's DLQ (TTL 0 expiry, like the baseline)."""
    conn = pika.BlockingConnection(pika.URLParameters(vhost_url(vhost)))
    channel = conn.channel()
    channel.queue_delete(APP_QUEUE)
    channel.queue_declare(
        APP_QUEUE,
        durable=True,
        arguments={"x-dead-letter-exchange": settings.RECOVERY_DLX, "x-message-ttl": 0},
    )
    started = time.perf_counter()
    for i in range(n):
        channel.basic_publish(
            "", APP_QUEUE, BODY, pika.BasicProperties(delivery_mode=2, message_id=f"m{i}")
        )
        if i % 20000 == 19999:
            conn.process_data_events(0)
    dlq = settings.RECOVERY_DEAD_LETTER_QUEUE
    while channel.queue_declare(dlq, passive=True).method.message_count < n:
        time.sleep(0.2)
    conn.close()
    return n / (time.perf_counter() - started)


def store_count(pg, above=0):
    return pg.execute("SELECT count(*) FROM recovery_message WHERE id > %s", [above]).fetchone()[0]


def progress(pg):
    """Rows stored so far, cheaply: ids start at 1 after the TRUNCATE ... RESTART IDENTITY.

    (A count(*) every 100 ms would steal the CPU being measured.) An id skipped by ON CONFLICT
    makes this an overestimate, so the end is confirmed with count(*).
    """
    return pg.execute("SELECT coalesce(max(id), 0) FROM recovery_message").fetchone()[0]


class BackendCpu:
    """CPU used by the PostgreSQL backends of one client (PostgreSQL runs on this machine)."""

    def __init__(self, pg, application_name):
        self.pg = pg
        self.application_name = application_name
        self.seen = {}

    def sample(self):
        for (pid,) in self.pg.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name = %s AND pid <> pg_backend_pid()",
            (self.application_name,),
        ).fetchall():
            used = cpu_seconds(pid)
            if used is not None:
                self.seen[pid] = used

    def total(self):
        return sum(self.seen.values())


def start_worker(vhost, args, log_path, database=None):
    env = {
        **os.environ,
        "DATABASE_URL": database or BENCH_DB,
        "RABBITMQ_URL": vhost_url(vhost),
        "CELERY_BROKER_URL": vhost_url(vhost),
        "RECOVERY_VHOSTS": vhost,
        "LOG_LEVEL": "WARNING",
    }
    if args.prefetch:
        env["COLLECTOR_PREFETCH"] = str(args.prefetch)
    if args.batch:
        env["COLLECTOR_BATCH_SIZE"] = str(args.batch)
    if args.processes is not None:
        env["COLLECTOR_PROCESSES"] = str(args.processes)
    if args.as_run:
        # The worker as scripts/run.sh starts it (prefork, its task queue), with beat embedded,
        # so the search indexer and the counts run behind the collector as they do in the product.
        pool = ["--concurrency", "2", "-B", "-s", str(ROOT / "var" / f"bench-beat-{os.getpid()}")]
        pool += ["-Q", settings.CELERY_TASK_DEFAULT_QUEUE]
    else:
        pool = ["--pool", "solo", "-Q", f"lazarus.bench.{os.getpid()}"]
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "console", "worker", "--collector"]
        + pool
        + ["-l", "warning"],
        cwd=ROOT,
        env=env,
        stdout=log_path.open("wb"),
        stderr=subprocess.STDOUT,
    )


def stop_worker(worker):
    worker.send_signal(signal.SIGTERM)
    try:
        worker.wait(timeout=30)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait()


def rss_mb(pid):
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def tree_rss_mb(pid):
    """(biggest, sum) RSS of the worker and its collector processes."""
    sizes = [rss_mb(p) for p in process_tree(pid)]
    return max(sizes), sum(sizes)


def identity_last_value(pg):
    """The last id recovery_message's identity handed out: the next stored row is above it.
    (Not max(id): ids an earlier round stored and deleted again are not reused.)"""
    sequence = pg.execute("SELECT pg_get_serial_sequence('recovery_message', 'id')").fetchone()[0]
    return pg.execute(
        f"SELECT CASE WHEN is_called THEN last_value ELSE last_value - 1 END FROM {sequence}"
    ).fetchone()[0]


def io_snapshot(pg):
    """The server's WAL counters (cluster-wide) and, per index of recovery_message in this
    database, the blocks read from outside shared_buffers: where a bigger store's inserts cost
    more (issue #34). Counters reach the view when a backend flushes them (at its exit here)."""
    wal = pg.execute("SELECT wal_records, wal_fpi, wal_bytes FROM pg_stat_wal").fetchone()
    reads = dict(
        pg.execute(
            "SELECT indexrelname, idx_blks_read FROM pg_statio_user_indexes "
            "WHERE relname = 'recovery_message'"
        ).fetchall()
    )
    reads["(heap)"] = pg.execute(
        "SELECT coalesce(heap_blks_read, 0) + coalesce(toast_blks_read, 0) "
        "FROM pg_statio_user_tables WHERE relname = 'recovery_message'"
    ).fetchone()[0]
    return {"wal": wal, "reads": reads}


def io_report(before, after, n):
    """Per message: WAL bytes, full-page images, blocks read (the three biggest indexes)."""
    records, fpi, size = (b - a for a, b in zip(before["wal"], after["wal"], strict=True))
    reads = {k: v - before["reads"].get(k, 0) for k, v in after["reads"].items()}
    top = sorted(reads.items(), key=lambda item: -item[1])[:3]
    return (
        f"WAL {size / n:,.0f} B ({fpi / n:.2f} full pages) per message; blocks read from outside "
        f"shared_buffers {sum(reads.values()) / n:.2f} per message, most: "
        + ", ".join(f"{name} {count / n:.2f}" for name, count in top)
    )


def drain(vhost, n, args, sample_rss=False, stored=None):
    """Drain N dead letters with one collector; returns (rate msg/s, rss samples, cpu report).

    Into an empty store (BENCH_DB, emptied first), or with ``stored`` (a database URL) into
    that store as it is, the drained rows deleted again afterwards (not vacuumed: a VACUUM
    would read every index of the big table for them)."""
    pg = psycopg.connect(stored or BENCH_DB, autocommit=True)
    if stored:
        base = identity_last_value(pg)
    else:
        base = 0
        pg.execute("TRUNCATE recovery_message RESTART IDENTITY CASCADE")
        pg.execute("VACUUM ANALYZE recovery_message")
    backends = BackendCpu(pg, "lazarus-collector")
    io_before = io_snapshot(pg)
    samples = []
    log_path = ROOT / "var" / f"bench-collector-{os.getpid()}.log"
    if args.in_process:
        from recovery.collector.consumer import start_collectors, stop_collectors

        settings.RECOVERY_VHOSTS = [vhost]
        tunables = {k: v for k, v in (("prefetch", args.prefetch), ("batch_size", args.batch)) if v}
        stop_event, threads = start_collectors(vhosts=[vhost], **tunables)
        pid, stop = os.getpid(), lambda: stop_collectors(stop_event, threads)
    else:
        worker = start_worker(vhost, args, log_path, stored)
        pid, stop = worker.pid, lambda: stop_worker(worker)
    expected = (
        1
        if args.in_process
        else collector_process_count(
            settings.COLLECTOR_PROCESSES if args.processes is None else args.processes
        )
    )
    amqp = pika.BlockingConnection(pika.URLParameters(vhost_url(vhost)))
    channel = amqp.channel()
    try:
        first_at = first_count = first_cpu = None
        last_sample = 0.0
        deadline = time.monotonic() + max(120, n / 500)
        while True:
            count = progress(pg) - base
            now = time.perf_counter()
            if (
                first_at is None
                and count
                and channel.queue_declare(DLQ, passive=True).method.consumer_count >= expected
            ):
                first_at, first_count, first_cpu = now, count, tree_cpu_seconds(pid)
                amqp.close()  # not needed any more (and it would miss its heartbeats)
            if now - last_sample >= 1.0:
                last_sample = now
                backends.sample()
                if sample_rss:
                    biggest, total = tree_rss_mb(pid)
                    samples.append((count, biggest, total))
                    if len(samples) % 5 == 1:
                        print(
                            f"  rss {biggest:7.1f} MB (biggest process), {total:7.1f} MB (all)"
                            f" at {count:>8} stored",
                            flush=True,
                        )
            if count >= n and store_count(pg, base) >= n:
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"drain stalled at {count}/{n}; see {log_path}")
            time.sleep(0.1)
        backends.sample()
        elapsed = now - first_at
        rate = (n - first_count) / elapsed if elapsed > 0 else float("inf")
        drained = n - first_count
        # The worker and its collector processes; one started after the first row counts from 0.
        used = sum(s - first_cpu.get(p, 0.0) for p, s in tree_cpu_seconds(pid).items())
        cpu = {
            "collector": used / drained * 1e6,
            "processes": len(process_tree(pid)),
            # Backends started with the collector, so this includes the first rows: close enough.
            "postgres": backends.total() / n * 1e6,
        }
    finally:
        stop()
        time.sleep(1.5)  # the backends' last counters
        cpu_io = io_report(io_before, io_snapshot(pg), n)
        if stored:
            pg.execute("DELETE FROM recovery_message WHERE id > %s", [base])
        pg.close()
        if amqp.is_open:
            amqp.close()
    cpu["io"] = cpu_io
    return rate, samples, cpu


def index_drained():
    """Run the search indexer over the drained rows; its rate in messages per second."""
    from django.db import connection

    from recovery.search import index as search_index

    connection.close()  # a fresh connection to the bench database
    started = time.perf_counter()
    indexed = search_index.index_new(budget_seconds=None)
    return indexed / (time.perf_counter() - started)


RACE_QUEUE = "bench.race"


def _race_process(*argv):
    """Start a bench/_race.py side and wait until it consumes."""
    child = subprocess.Popen(
        [sys.executable, "-m", "bench._race", *argv], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    if child.stdout.readline().strip() != "ready":
        child.kill()
        raise SystemExit(f"bench._race {argv[0]} did not start")
    return child


def _fill_race_queue(url, n, dead_letter_exchange):
    conn = pika.BlockingConnection(pika.URLParameters(url))
    channel = conn.channel()
    channel.queue_delete(RACE_QUEUE)
    channel.queue_declare(
        RACE_QUEUE, durable=True, arguments={"x-dead-letter-exchange": dead_letter_exchange}
    )
    for i in range(n):
        channel.basic_publish(
            "", RACE_QUEUE, BODY, pika.BasicProperties(delivery_mode=2, message_id=f"r{i}")
        )
        if i % 20000 == 19999:
            conn.process_data_events(0)
    while channel.queue_declare(RACE_QUEUE, passive=True).method.message_count < n:
        time.sleep(0.2)
    conn.close()


def race_collector(vhost, n, args):
    """The collector drains while the broker dead-letters N rejects: msg/s and CPU per message."""
    pg = psycopg.connect(BENCH_DB, autocommit=True)
    pg.execute("TRUNCATE recovery_message RESTART IDENTITY CASCADE")
    pg.execute("VACUUM ANALYZE recovery_message")
    _fill_race_queue(vhost_url(vhost), n, settings.RECOVERY_DLX)
    backends = BackendCpu(pg, "lazarus-collector")
    log_path = ROOT / "var" / f"bench-collector-race-{os.getpid()}.log"
    worker = start_worker(vhost, args, log_path)
    expected = collector_process_count(
        settings.COLLECTOR_PROCESSES if args.processes is None else args.processes
    )
    amqp = pika.BlockingConnection(pika.URLParameters(vhost_url(vhost)))
    try:
        deadline = time.monotonic() + 120
        while amqp.channel().queue_declare(DLQ, passive=True).method.consumer_count < expected:
            if time.monotonic() > deadline:
                raise SystemExit(f"the collector did not start; see {log_path}")
            time.sleep(0.2)
        amqp.close()
        cpu_before = tree_cpu_seconds(worker.pid)
        started = time.perf_counter()
        rejecter = _race_process("reject", vhost_url(vhost), RACE_QUEUE, str(n))
        deadline = time.monotonic() + max(120, n / 200)
        last_sample = 0.0
        while not (progress(pg) >= n and store_count(pg) >= n):
            if time.monotonic() > deadline:
                raise SystemExit(f"race stalled at {progress(pg)}/{n}; see {log_path}")
            if time.perf_counter() - last_sample >= 1.0:
                last_sample = time.perf_counter()
                backends.sample()
            time.sleep(0.05)
        elapsed = time.perf_counter() - started
        backends.sample()
        used = sum(s - cpu_before.get(p, 0.0) for p, s in tree_cpu_seconds(worker.pid).items())
        processes = len(process_tree(worker.pid))
        if rejecter.wait(timeout=30):
            raise SystemExit("the rejecter failed")
        stored = store_count(pg)
        if stored != n:
            raise SystemExit(f"race stored {stored} rows for {n} messages")
        # Rows per committed batch: every row of one COPY transaction shares its xmin.
        commits = pg.execute(
            "SELECT count(DISTINCT xmin::text::bigint) FROM recovery_message"
        ).fetchone()[0]
    finally:
        stop_worker(worker)
        pg.close()
        if amqp.is_open:
            amqp.close()
    return n / elapsed, {
        "collector": used / n * 1e6,
        "postgres": backends.total() / n * 1e6,
        "batch": n / commits,
        "processes": processes,
    }


def race_raw(n, management):
    """The raw drainer raced the same way, on its own quorum DLQ in its own vhost."""
    vhost = f"lazarus-bench-{os.getpid()}-race-raw"
    make_vhost(management, vhost)
    url = vhost_url(vhost)
    try:
        conn = pika.BlockingConnection(pika.URLParameters(url))
        channel = conn.channel()
        channel.exchange_declare("race.dlx", "fanout", durable=True)
        channel.queue_declare("race.dlq", durable=True, arguments={"x-queue-type": "quorum"})
        channel.queue_bind("race.dlq", "race.dlx")
        conn.close()
        _fill_race_queue(url, n, "race.dlx")
        drainer = _race_process("raw-drain", url, "race.dlq", str(n), BENCH_DB)
        started = time.perf_counter()
        rejecter = _race_process("reject", url, RACE_QUEUE, str(n))
        out, _ = drainer.communicate(timeout=max(120, n / 200))
        elapsed = time.perf_counter() - started
        if drainer.returncode or rejecter.wait(timeout=30):
            raise SystemExit(f"the raw race failed: {out}")
    finally:
        management.delete_vhost(vhost)
    return n / elapsed


def race(vhost, n, args, management):
    print(f"race: {n} 1 KiB messages rejected (nack every 1,000) while being drained")
    rates, raws = [], []
    for _round in range(args.rounds):
        rate, cpu = race_collector(vhost, n, args)
        rates.append(rate)
        print(
            f"  collector race {rate:9.0f} msg/s  (CPU per message: collector "
            f"{cpu['collector']:.0f} us in {cpu['processes']} process(es), its PostgreSQL "
            f"backends {cpu['postgres']:.0f} us; {cpu['batch']:.0f} rows per commit)"
        )
        raw = race_raw(n, management)
        raws.append(raw)
        print(f"  raw race       {raw:9.0f} msg/s   this round: {rate / raw:.2f}")
    rate, raw = max(rates), max(raws)
    rounds = [r / w for r, w in zip(rates, raws, strict=True)]
    print(
        f"race ratio: median of {len(rounds)} rounds {statistics.median(rounds):.2f} "
        f"(rounds: {', '.join(f'{r:.2f}' for r in rounds)}); best of each side "
        f"{rate:.0f} / {raw:.0f} = {rate / raw:.2f}"
    )
    return rate / raw


def run_baseline(n, management):
    vhost = f"lazarus-bench-{os.getpid()}-baseline"
    make_vhost(management, vhost)
    pg = psycopg.connect(BENCH_DB, autocommit=True)
    backends = BackendCpu(pg, "")  # the baseline does not name its connection
    try:
        child = subprocess.Popen(
            [sys.executable, str(BASELINE), str(n)],
            env={**os.environ, "RABBITMQ_URL": vhost_url(vhost), "BASELINE_DATABASE_URL": BENCH_DB},
            stdout=subprocess.PIPE,
            text=True,
        )
        while child.poll() is None:
            backends.sample()
            time.sleep(0.5)
        out = child.stdout.read()
        if child.returncode:
            raise SystemExit(f"drain_baseline.py failed ({child.returncode}):\n{out}")
    finally:
        management.delete_vhost(vhost)
        pg.close()
    print("  baseline:", out.strip().replace("\n", "\n  baseline: "))
    return float(re.search(r"drain DLQ -> PG .*?(\d+) msg/s", out).group(1)), backends.total() / n


def stored_against_empty(vhost, args):
    """The same drain into a big store and into an empty one, alternating (issue #34: index
    maintenance grows with the table)."""
    with psycopg.connect(args.stored) as pg:
        held = pg.execute("SELECT count(*) FROM recovery_message").fetchone()[0]
    print(f"collector drain of {args.n} 1 KiB dead letters: into {held} stored against empty")
    ratios = []
    for _round in range(args.rounds):
        rates = {}
        for which, stored in (("empty", None), ("stored", args.stored)):
            print(f"  fill {fill(vhost, args.n):9.0f} msg/s")
            rates[which], _, cpu = drain(vhost, args.n, args, stored=stored)
            print(
                f"  into {'the empty store' if stored is None else f'{held} stored'}: "
                f"{rates[which]:9.0f} msg/s  (CPU per message: "
                f"collector {cpu['collector']:.0f} us, PostgreSQL {cpu['postgres']:.0f} us)\n"
                f"    {cpu['io']}",
                flush=True,
            )
        ratios.append(rates["stored"] / rates["empty"])
        print(f"  this round: stored / empty = {ratios[-1]:.2f}", flush=True)
    print(
        f"stored / empty: median {statistics.median(ratios):.2f}, best {max(ratios):.2f} "
        f"({', '.join(f'{r:.2f}' for r in ratios)})"
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("n", nargs="?", type=int, default=100_000)
    parser.add_argument("--rss", type=int, default=0, help="also drain this many, sampling RSS")
    parser.add_argument("--rss-only", action="store_true")
    parser.add_argument(
        "--race",
        type=int,
        nargs="?",
        const=30_000,
        default=0,
        help="also race N rejects being dead-lettered while drained (default 30000)",
    )
    parser.add_argument("--skip-baseline", action="store_true")
    parser.add_argument(
        "--as-run",
        action="store_true",
        help="start the worker as scripts/run.sh does (prefork 2, beat: indexer and counts run)",
    )
    parser.add_argument("--in-process", action="store_true")
    parser.add_argument("--prefetch", type=int)
    parser.add_argument("--batch", type=int)
    parser.add_argument(
        "--processes", type=int, help="COLLECTOR_PROCESSES for the worker (default: the product's)"
    )
    parser.add_argument(
        "--rounds", type=int, default=2, help="collector + baseline pairs; best of each is used"
    )
    parser.add_argument(
        "--stored",
        metavar="URL",
        help="instead: drains into the store of this database as it is (bench/ui.py's, e.g. 10M "
        "messages; the drained rows are deleted again) against drains into an empty store, "
        "alternating, --rounds pairs: stored / empty",
    )
    args = parser.parse_args()

    ensure_database()
    management = Management()
    vhost = f"lazarus-bench-{os.getpid()}"
    make_vhost(management, vhost)
    try:
        wire(vhost)
        quiet = None
        if args.stored:
            stored_against_empty(vhost, args)
        elif not args.rss_only:
            print(f"collector drain of {args.n} 1 KiB dead letters, {args.rounds} round(s)")
            rates, baselines = [], []
            for _round in range(args.rounds):
                print(f"  fill {fill(vhost, args.n):9.0f} msg/s")
                rate, _, cpu = drain(vhost, args.n, args)
                rates.append(rate)
                print(
                    f"  collector drain DLQ -> store {rate:9.0f} msg/s  (CPU per message: "
                    f"collector {cpu['collector']:.0f} us in {cpu['processes']} process(es), "
                    f"its PostgreSQL backends {cpu['postgres']:.0f} us)"
                )
                print(f"  search indexer behind it     {index_drained():9.0f} msg/s")
                if not args.skip_baseline:
                    baseline, baseline_pg = run_baseline(args.n, management)
                    baselines.append(baseline)
                    print(f"  (baseline's PostgreSQL backend: {baseline_pg * 1e6:.0f} us/message)")
                    print(f"  this round: collector / baseline = {rate / baseline:.2f}")
            rate = max(rates)
            if baselines:
                baseline = max(baselines)
                # Best of each: other load on the machine only ever slows a run down.
                quiet = rate / baseline
                print(f"collector / baseline = {rate:.0f} / {baseline:.0f} = {quiet:.2f}")
        if args.race:
            race_ratio = race(vhost, args.race, args, management)
            if quiet is not None:
                print(f"quiet ratio {quiet:.2f}, race ratio {race_ratio:.2f}")
        if args.rss or args.rss_only:
            n = args.rss or 1_000_000
            print(f"collector RSS while draining {n} 1 KiB dead letters")
            print(f"  fill {fill(vhost, n):9.0f} msg/s")
            rate, samples, _cpu = drain(vhost, n, args, sample_rss=True)
            print(f"  drained at {rate:.0f} msg/s with {_cpu['processes']} collector process(es)")
            for label, index in (("the biggest process", 1), ("all processes", 2)):
                rss = [sample[index] for sample in samples if sample[0]]  # from the first row on
                print(
                    f"  RSS of {label}: first {rss[0]:.1f} MB, "
                    f"median {sorted(rss)[len(rss) // 2]:.1f} MB, last {rss[-1]:.1f} MB, "
                    f"peak {max(rss):.1f} MB (target: flat, < 250 MB)"
                )
    finally:
        management.delete_vhost(vhost)


if __name__ == "__main__":
    main()
