"""Retention while the collector drains a flood, on a big store (issue #34).

    BENCH_DATABASE_URL=... .venv/bin/python bench/retention.py [--expire 600000] [--flood 30000]
                                                             [--rounds 3]

Needs a loaded store: the database `bench/ui.py N` loads (BENCH_DATABASE_URL, default
``postgresql://postgres@127.0.0.1:5432/lazarus_bench_ui``; 1M messages over 14 days, 18 %
replayed or discarded). Each round:

1. ages EXPIRE replayed or discarded messages past RETENTION_DAYS (30), as a month passing would;
2. **quiet**: FLOOD real 1 KiB dead letters into a private vhost's ``recovery.dead_letters``,
   then a real ``celery worker --collector`` drains them into the store: its rate;
3. **with retention**: the same flood, drained while ``apply_retention`` deletes the expired
   messages in its batches; meanwhile a probe connection with ``lock_timeout = 1s`` updates rows
   retention is deleting and rows it keeps, one after another, and records how long each waited;
4. the message table's size (heap, TOAST and indexes) after the round.

Prints per round the drain rate with retention / without (the issue: ≥ 0.8), retention's rate,
the probe's longest wait (the issue: no lock held past 1 s; a wait past 1 s is counted as a
lock timeout), and the sizes across rounds (the issue: they do not keep growing). The median of
the ratios beside the rounds. Prints; never asserts.
"""

import argparse
import contextlib
import datetime
import os
import random
import statistics
import sys
import threading
import time
import urllib.parse
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("BENCH_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/lazarus_bench_ui")

import psycopg  # noqa: E402
from django.conf import settings  # noqa: E402
from django.db import connection, transaction  # noqa: E402

from bench import collector as drain_bench  # noqa: E402  (sets up Django on BENCH_DB)
from recovery.broker.management import Management  # noqa: E402
from recovery.broker.topology import wire  # noqa: E402
from recovery.retention import run as retention  # noqa: E402
from recovery.retention.run import BATCH, apply_retention  # noqa: E402

BENCH_DB = drain_bench.BENCH_DB
DAYS = 30
SIZE_SQL = """
SELECT pg_relation_size('recovery_message'),
       pg_total_relation_size('recovery_message') - pg_relation_size('recovery_message')
         - pg_indexes_size('recovery_message'),
       pg_indexes_size('recovery_message')
"""


def cutoffs(pg, rounds, expire=None):
    """The retention cutoffs of the rounds: time passes over the store's replayed and discarded
    messages (their last change spread over the days the loader wrote). Without ``expire``, in
    ``rounds`` equal steps of time, each deleting about 1/rounds of them; with it, each round's
    cutoff is the last change of the next ``expire`` oldest, so each round deletes ``expire``.
    (Moving retention's clock, not the rows: an UPDATE that ages rows would itself bloat the
    table this measures.)"""
    done = "status IN ('replayed', 'discarded')"
    if expire:
        held = pg.execute(f"SELECT count(*) FROM recovery_message WHERE {done}").fetchone()[0]
        if expire * rounds > held:
            raise SystemExit(
                f"{rounds} rounds of {expire:,} need {expire * rounds:,} replayed or discarded "
                f"messages; the store holds {held:,}"
            )
        return [
            pg.execute(
                f"SELECT updated_at FROM recovery_message WHERE {done} "
                "ORDER BY updated_at OFFSET %s LIMIT 1",
                (expire * k,),
            ).fetchone()[0]
            for k in range(1, rounds + 1)
        ]
    oldest, newest = pg.execute(
        f"SELECT min(updated_at), max(updated_at) FROM recovery_message WHERE {done}"
    ).fetchone()
    step = (newest - oldest) / rounds
    return [oldest + step * k for k in range(1, rounds + 1)]


AUTOVACUUM = {
    # docs/big-store.md, "Autovacuum for recovery_message": its recommendation for a big store
    "recommended": "autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 10000, "
    "autovacuum_vacuum_insert_scale_factor = 0.05, autovacuum_analyze_scale_factor = 0.02, "
    "autovacuum_vacuum_cost_limit = 2000",
}
RESET = (
    "autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold, "
    "autovacuum_vacuum_insert_scale_factor, autovacuum_analyze_scale_factor, "
    "autovacuum_vacuum_cost_limit"
)


def drain_flood(vhost, n, during=None):
    """Fill N dead letters, start a collector worker, time until the store holds N more rows;
    ``during`` runs in a thread from the first stored row on. Returns (rate, during's result)."""
    pg = psycopg.connect(BENCH_DB, autocommit=True)
    drain_bench.fill(vhost, n)
    before = drain_bench.identity_last_value(pg)
    args = SimpleNamespace(prefetch=None, batch=None, processes=None, as_run=False)
    log_path = ROOT / "var" / f"bench-retention-{os.getpid()}.log"
    worker = drain_bench.start_worker(vhost, args, log_path)
    result, thread = {}, None
    try:
        deadline = time.monotonic() + max(300, n / 100)
        started = None
        while True:
            newest = pg.execute("SELECT coalesce(max(id), 0) FROM recovery_message").fetchone()[0]
            stored = newest - before
            now = time.perf_counter()
            if started is None and stored > 0:
                started, first = now, stored
                if during is not None:
                    thread = threading.Thread(target=lambda: result.update(during()), daemon=True)
                    thread.start()
            if stored >= n:
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"drain stalled at {stored}/{n}; see {log_path}")
            time.sleep(0.1)
        if now == started:
            raise SystemExit(
                "the flood was stored between two polls: nothing to time (a slow max(id)?); "
                "VACUUM recovery_message or raise --flood"
            )
        rate = (n - first) / (now - started)
    finally:
        drain_bench.stop_worker(worker)
        pg.close()
    if thread is not None:
        thread.join()
    return rate, result


class LockProbe:
    """Updates rows retention deletes and rows it keeps, one statement at a time, with
    lock_timeout 1 s; records each statement's time (a row locked by retention makes it wait)."""

    def __init__(self, expiring, kept):
        self.ids = expiring + kept
        self.waits, self.timeouts = [], 0
        self.stop = threading.Event()

    def run(self):
        with psycopg.connect(BENCH_DB, autocommit=True) as pg:
            pg.execute("SET lock_timeout = '1s'")
            while not self.stop.is_set():
                pk = random.choice(self.ids)
                started = time.perf_counter()
                try:
                    pg.execute(
                        "UPDATE recovery_message SET last_replayed_at = last_replayed_at "
                        "WHERE id = %s",
                        (pk,),
                    )
                except psycopg.errors.LockNotAvailable:
                    self.timeouts += 1
                self.waits.append(time.perf_counter() - started)
                time.sleep(0.01)


def retention_with_probe(pg, cutoff, batch, duty=None):
    expiring = [
        r[0]
        for r in pg.execute(
            "SELECT id FROM recovery_message WHERE status IN ('replayed', 'discarded') "
            "AND updated_at < %s ORDER BY random() LIMIT 2000",
            (cutoff,),
        ).fetchall()
    ]
    kept = [
        r[0]
        for r in pg.execute(
            "SELECT id FROM recovery_message WHERE status = 'pending' ORDER BY random() LIMIT 2000"
        ).fetchall()
    ]
    probe = LockProbe(expiring, kept)

    batches = []  # how long each of retention's transactions held its row locks
    real_atomic = retention.transaction.atomic

    @contextlib.contextmanager
    def timed_atomic(*args, **kwargs):
        started = time.perf_counter()
        with real_atomic(*args, **kwargs):
            yield
        batches.append(time.perf_counter() - started)

    def during():
        thread = threading.Thread(target=probe.run, daemon=True)
        thread.start()
        started = time.perf_counter()
        retention.transaction = SimpleNamespace(atomic=timed_atomic)
        try:
            result = apply_retention(
                days=DAYS,
                now=cutoff + datetime.timedelta(days=DAYS),
                batch=batch,
                duty=duty,
                budget_seconds=24 * 3600,  # the whole round's expired messages
            )
        finally:
            retention.transaction = transaction
            connection.close()
            probe.stop.set()
            thread.join()
        elapsed = time.perf_counter() - started
        return {
            "deleted": result["messages"],
            "seconds": elapsed,
            "probe": probe,
            "longest_batch": max(batches, default=0.0),
        }

    return during


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--flood", type=int, default=30_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--expire",
        type=int,
        default=None,
        help="messages each round's retention deletes (default: 1/rounds of the replayed and "
        "discarded ones)",
    )
    parser.add_argument("--batch", type=int, default=BATCH, help=f"retention's (default {BATCH})")
    parser.add_argument(
        "--duty",
        type=float,
        default=None,
        help=f"retention's share of the time (default RETENTION_DUTY, {settings.RETENTION_DUTY})",
    )
    parser.add_argument(
        "--autovacuum",
        choices=["recommended", "default"],
        default="recommended",
        help="the message table's autovacuum settings: docs/big-store.md's, or PostgreSQL's",
    )
    args = parser.parse_args()
    drain_bench.ensure_database()  # migrated to this code
    pg = psycopg.connect(BENCH_DB, autocommit=True)
    stored = pg.execute("SELECT count(*) FROM recovery_message").fetchone()[0]
    if stored < 100_000:
        raise SystemExit(f"{BENCH_DB} holds {stored} messages: load it first (bench/ui.py N)")
    pg.execute(f"ALTER TABLE recovery_message RESET ({RESET})")
    if args.autovacuum != "default":
        pg.execute(f"ALTER TABLE recovery_message SET ({AUTOVACUUM[args.autovacuum]})")
    rounds = cutoffs(pg, args.rounds, args.expire)
    # A server with autovacuum off (this project's CI PostgreSQL: conf.d/90-ci.conf) never
    # reclaims the deleted rows, so the table would grow whatever retention does: there the
    # bench vacuums after each round, as autovacuum would with the recommended settings, and
    # says so.
    autovacuum_on = pg.execute("SHOW autovacuum").fetchone()[0] == "on"
    if not autovacuum_on:
        print(
            "autovacuum is off on this server: VACUUM (ANALYZE) before the first round and "
            "after each round instead"
        )
        # (Rows an earlier bench inserted and deleted leave dead entries at the newest end of the
        # primary key, which every max(id) poll below would walk through.)
        pg.execute("VACUUM (ANALYZE) recovery_message")
    print(
        f"{stored} messages in {BENCH_DB}; {args.rounds} rounds of a flood of {args.flood} "
        f"twice, retention (batch {args.batch}, duty "
        f"{settings.RETENTION_DUTY if args.duty is None else args.duty}) once; "
        f"autovacuum: {args.autovacuum}",
        flush=True,
    )
    management = Management()
    vhost = f"lazarus-bench-retention-{os.getpid()}"
    drain_bench.make_vhost(management, vhost)
    settings.RECOVERY_VHOSTS = [vhost]
    base = urllib.parse.urlparse(settings.RABBITMQ_URL)
    settings.RABBITMQ_URL = base._replace(path="/" + urllib.parse.quote(vhost, safe="")).geturl()
    ratios, sizes = [], [pg.execute(SIZE_SQL).fetchone()]
    try:
        wire(vhost)
        for round_no, cutoff in enumerate(rounds, 1):
            quiet, _ = drain_flood(vhost, args.flood)
            during = retention_with_probe(pg, cutoff, args.batch, args.duty)
            busy, got = drain_flood(vhost, args.flood, during=during)
            probe = got["probe"]
            ratio = busy / quiet
            ratios.append(ratio)
            if not autovacuum_on:
                pg.execute("VACUUM (ANALYZE) recovery_message")
            sizes.append(pg.execute(SIZE_SQL).fetchone())
            print(
                f"round {round_no}: drain {quiet:,.0f} msgs/s quiet, {busy:,.0f} "
                f"with retention = {ratio:.2f}; retention deleted {got['deleted']:,} in "
                f"{got['seconds']:.0f} s ({got['deleted'] / got['seconds']:,.0f}/s), longest batch "
                f"{got['longest_batch'] * 1000:.0f} ms; probe "
                f"{len(probe.waits)} updates, longest {max(probe.waits) * 1000:.0f} ms, "
                f"p99 {sorted(probe.waits)[int(len(probe.waits) * 0.99)] * 1000:.0f} ms, "
                f"lock timeouts (>1 s) {probe.timeouts}",
                flush=True,
            )
    finally:
        management.delete_vhost(vhost)
    print(
        f"drain with retention / quiet: median {statistics.median(ratios):.2f} "
        f"(rounds {', '.join(f'{r:.2f}' for r in ratios)}; best {max(ratios):.2f})"
    )
    mb = 1024 * 1024
    print("recovery_message size (heap / TOAST / indexes, MB), before and after each round:")
    for i, (heap, toast, indexes) in enumerate(sizes):
        print(
            f"  {'before' if i == 0 else f'round {i}':>8}: {heap / mb:8.0f} / "
            f"{toast / mb:6.0f} / {indexes / mb:8.0f}"
        )


if __name__ == "__main__":
    main()
