"""Console server times with a million stored messages: p95 against the issue's targets.

    .venv/bin/python bench/ui.py [N]        # default 1000000 messages
    options: --runs R (timed requests per page, default 60), --reload (load the store again),
             --groups G (about G failure groups), --load-only, --sessions S (row inserters, 2)

Loads N messages into a scratch database (BENCH_DATABASE_URL, default
``postgresql://postgres@127.0.0.1:5432/lazarus_bench_ui``; kept between runs, loaded again only
when its size or groups differ or an earlier load did not finish), then times the console views
in-process with Django's test Client (URL routing, middleware, session auth, view, template; no
network) and prints each page's p95 as a ratio to its target:

    list with filters  < 100 ms      message_id search  < 50 ms
    detail             < 50 ms       overview           < 200 ms
    groups (API)       < 200 ms (ours; the issues name none)
    /metrics scrape    < 100 ms      alert evaluation cycle (20 rules) < 100 ms

Then (issue #31) the message list, search and detail as a member of a team scoped to a tenth of
the queues (the glob ``orders.1?``: 2 of the 16) against a user in no team, on the same URLs
(all inside the team's scope): ``team p95 / global p95`` (the issue asks for at most 1.2).

With ``--masked`` (issue #32) it times only the message list, the detail page and the failure
groups page (the list whose rows preview a body) with masking rules in force (a JSON path, a
regular expression and a header, all matching the bench bodies) against none, on the same URLs,
the rules created and deleted between interleaved requests: ``masked p95 / unmasked p95`` (the
issue asks for at most 1.2).

The load is a bulk load, as a restore would be, and prints each phase's time: the database
made anew by the migrations; its secondary indexes, constraints, the trigram index and the
count triggers taken off; the rows made by PostgreSQL (INSERT ... SELECT over generate_series,
two sessions), each with its search document (the indexer's own expression); then in two
sessions at once a sample of documents written again by the indexer and compared, and the
trigram index, and the messages' indexes and constraints one by one, the counts
(``MessageCount/MessageTotal.rebuild()`` and ``compact()``: what the triggers and beat leave;
VACUUM FULL, since most rows the rebuild wrote were folded away) and VACUUM ANALYZE; the
triggers go back on last. The store ends as the product's would be: same schema, counts and
documents.

Beside each, the bare SQL a page cannot do without (psycopg, same database, same run) as
``page / raw``; for the overview and the groups that raw query is the GROUP BY over the messages
that the MessageCount rollup replaces. Prints, never asserts.
"""

import argparse
import concurrent.futures
import datetime
import os
import random
import statistics
import sys
import threading
import time
import urllib.parse
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench._django import setup_django  # noqa: E402

BENCH_DB = setup_django("lazarus_bench_ui")

import psycopg  # noqa: E402
from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402

from recovery.broker.management import Management  # noqa: E402
from recovery.broker.topology import wire  # noqa: E402
from recovery.collector.rows import failure_group  # noqa: E402
from recovery.db import database_conninfo  # noqa: E402
from recovery.models import MessageCount, MessageTotal  # noqa: E402
from recovery.search import index as search_index  # noqa: E402

# groups (GET /api/v1/groups) has no target in the issues: an aggregate like the overview, it is
# held to the overview's.
TARGETS_MS = {
    "list": 100,
    "search": 50,
    "detail": 50,
    "overview": 200,
    "groups": 200,
    "metrics": 100,
}
ALERT_CYCLE_TARGET_MS = 100  # one evaluation cycle of 20 rules (issue #17)
QUEUES = [f"orders.{i}" for i in range(12)] + ["payments", "billing", "shipping", "email"]
EXCEPTIONS = [
    ("", ""),
    ("TimeoutError", "upstream timed out after 3000 ms"),
    ("ValueError", "bad sku 1234"),
]
STATUSES = ["pending"] * 80 + ["replayed"] * 15 + ["discarded"] * 3 + ["poisoned"] * 2
WINDOW = datetime.timedelta(days=14)


def ensure_database():
    admin = BENCH_DB.rsplit("/", 1)[0] + "/postgres"
    name = BENCH_DB.rsplit("/", 1)[1]
    with psycopg.connect(admin, autocommit=True) as pg:
        if not pg.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            pg.execute(f'CREATE DATABASE "{name}"')
    call_command("migrate", verbosity=0)


def exceptions_for(groups):
    """EXCEPTIONS, plus as many more exception types as make about ``groups`` failure groups
    (each type is a group per queue and reason: 16 x 3, and one unroutable)."""
    base = len(EXCEPTIONS) * (len(QUEUES) * 3 + 1)
    extra = max(0, (groups - base) // (len(QUEUES) * 3 + 1))
    more = [(f"RuleViolation{chr(65 + k % 26)}{k // 26}", "rule") for k in range(extra)]
    return EXCEPTIONS + more


# The bench's rows, made by PostgreSQL itself (one INSERT ... SELECT per slice of the series,
# several sessions at once): 16 queues, a failure group per queue, reason and exception type
# (``exceptions_for``), one in 20 unroutable, 14 days of history weighted to the newest end, JSON
# bodies. Each row's "random" choices are hashes of its number (hashint8extended, seeded per
# choice), so a load is the same whatever the slices and sessions. Group keys and labels come
# from the collector's own ``failure_group`` (computed in Python for the few thousand
# combinations and joined in), the fingerprint is sha256('bench-<seed>-<i>'). The same statement
# writes each row's search document from the row it stored, with the indexer's own expression
# (search_index.SEARCH_DOCUMENT_SQL: what the indexer writes for a body stored as readable text,
# as every bench body is; tests/search checks it against the indexer, the load a sample).
ROW_SQL = (
    """
WITH g (slot, key, label, exc_type, exc_message) AS (
    SELECT * FROM unnest(%(slots)s::int[], %(keys)s::text[], %(labels)s::text[],
                         %(types)s::text[], %(messages)s::text[])
), stored AS (
INSERT INTO recovery_message (
    kind, vhost, source_queue, source_exchange, routing_keys, reason, death_count,
    first_death_at, last_death_at, message_id, correlation_id, properties, headers, body,
    body_size, content_type, content_encoding, fingerprint, group_key, group_label, status,
    status_reason, replay_count, collected_at, updated_at
)
SELECT
    r.kind, '/', r.queue, 'shop',
    jsonb_build_array(coalesce(nullif(r.queue, ''), 'orders.created')),
    r.reason, 1, r.at, r.at, md5('m-' || %(seed)s || '-' || r.i)::uuid::text, 'corr-' || r.i,
    '{"delivery_mode": 2, "content_type": "application/json"}'::jsonb,
    jsonb_build_object(
        'tenant', 'tenant-' || r.h5 %% 50, 'trace', md5('t-' || %(seed)s || '-' || r.i))
        || CASE WHEN g.exc_type = '' THEN '{}'::jsonb ELSE jsonb_build_object(
            'x-exception-type', g.exc_type, 'x-exception-message', g.exc_message) END,
    r.body, octet_length(r.body), 'application/json', '',
    encode(sha256(convert_to('bench-' || %(seed)s || '-' || r.i, 'UTF8')), 'hex'),
    g.key, g.label, r.status, '', CASE WHEN r.status = 'replayed' THEN 1 ELSE 0 END, r.at, r.at
FROM (
    SELECT h.*,
        CASE WHEN h.i %% 20 = 0 THEN 'unroutable' ELSE 'dead_letter' END AS kind,
        CASE WHEN h.i %% 20 = 0 THEN '' ELSE (%(queues)s::text[])[h.h0 %% 16 + 1] END AS queue,
        CASE WHEN h.i %% 20 = 0 THEN 'no_route'
             ELSE (ARRAY['rejected', 'expired', 'maxlen'])[h.h1 %% 3 + 1] END AS reason,
        h.h2 %% %(exceptions)s * 49
            + CASE WHEN h.i %% 20 = 0 THEN 48 ELSE h.h0 %% 16 * 3 + h.h1 %% 3 END AS slot,
        CASE WHEN h.h3 %% 100 < 80 THEN 'pending' WHEN h.h3 %% 100 < 95 THEN 'replayed'
             WHEN h.h3 %% 100 < 98 THEN 'discarded' ELSE 'poisoned' END AS status,
        %(now)s::timestamptz
            - interval '14 days' * power(h.h4 / 2147483648.0::float8, 1.5::float8) AS at,
        convert_to(format(
            '{"order": %%s, "sku": "SKU-%%s", '
            '"customer": {"id": %%s, "email": "user%%s@example.com"}, '
            '"lines": [%%s], "note": "deliver to the back door"}',
            h.i, h.h6 %% 10000, h.h7 %% 1000000, h.i,
            substr(repeat(
                ', {"qty": ' || (1 + h.h8 %% 4) || ', "price": "12.50"}', 1 + h.h9 %% 3), 3)
        ), 'UTF8') AS body
    FROM (
        SELECT i, """
    + ", ".join(
        f"(hashint8extended(i, %(seed)s * 16 + {k}) & 2147483647)::int AS h{k}" for k in range(10)
    )
    + """
        FROM generate_series(%(low)s::bigint, %(high)s::bigint - 1) AS i
    ) AS h
) AS r
JOIN g ON g.slot = r.slot
RETURNING id, """
    + search_index.SEARCH_DOCUMENT_SQL
    + """ AS document
)
INSERT INTO recovery_messagesearch (message_id, document) SELECT id, document FROM stored
"""
)


def group_table(groups):
    """ROW_SQL's failure groups: slot (exception index x 49 + queue x 3 + reason, 48 for the
    unroutable) -> key and label as the collector makes them."""
    table = {"slots": [], "keys": [], "labels": [], "types": [], "messages": []}
    exceptions = exceptions_for(groups)
    for e, (exc_type, exc_message) in enumerate(exceptions):
        headers = {"x-exception-type": exc_type, "x-exception-message": exc_message}
        if not exc_type:
            headers = {}
        wheres = [(q, r) for q in QUEUES for r in ("rejected", "expired", "maxlen")]
        for s, (where, reason) in enumerate([*wheres, ("shop", "no_route")]):
            key, label = failure_group(where, reason, headers)
            for name, value in zip(
                table, (e * 49 + s, key, label, exc_type, exc_message), strict=True
            ):
                table[name].append(value)
    return table, len(exceptions)


def insert_rows(n, now, groups, workers, report, seed=7, slice_rows=250_000):
    """N rows in slices of ``slice_rows``, ``workers`` sessions at once (one transaction each)."""
    table, exceptions = group_table(groups)
    params = {**table, "exceptions": exceptions, "queues": QUEUES, "now": now, "seed": seed}
    slices = [(low, min(low + slice_rows, n)) for low in range(0, n, slice_rows)]
    done = [0]
    lock = threading.Lock()

    def run(bounds):
        with psycopg.connect(database_conninfo(), autocommit=True) as pg:
            pg.execute("SET jit = off")  # compiling these expressions costs more than it saves
            pg.execute(ROW_SQL, {**params, "low": bounds[0], "high": bounds[1]})
        with lock:
            done[0] += bounds[1] - bounds[0]
            report(f"rows {done[0]}/{n}")

    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        list(pool.map(run, slices))


# Bulk load, as a restore would do it: the rows first, then each index built once, the search
# documents written and the counts taken in one pass each, then VACUUM ANALYZE (this machine's
# PostgreSQL runs with autovacuum off). Building an index sorts once; maintaining it row by row
# (and the trigram index above all) is what made the load, not the pages, slow.
MESSAGES, DOCUMENTS = "recovery_message", "recovery_messagesearch"
INSERT_TRIGGERS = ("recovery_message_count_insert", "recovery_message_total_insert")


def recreate_database():
    """An empty database migrated to this code: whatever an earlier (maybe interrupted) load
    left, the schema is then the migrations' own, every index and trigger in place."""
    admin = BENCH_DB.rsplit("/", 1)[0] + "/postgres"
    name = BENCH_DB.rsplit("/", 1)[1]
    connection.close()
    with psycopg.connect(admin, autocommit=True) as pg:
        pg.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        pg.execute(f'CREATE DATABASE "{name}"')
    call_command("migrate", verbosity=0)
    connection.close()


def deferred_schema(pg):
    """What the load takes off and puts back, from the catalog: (secondary indexes of the
    messages, their constraints but the primary key (the unique fingerprint; the foreign keys),
    the documents' foreign key, the trigram index), each as (name, SQL that recreates it)."""

    def indexes(table):
        return pg.execute(
            "SELECT c.relname, pg_get_indexdef(i.indexrelid) FROM pg_index i "
            "JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = %s::regclass "
            "AND NOT i.indisprimary AND NOT EXISTS "
            "(SELECT 1 FROM pg_constraint k WHERE k.conindid = i.indexrelid) ORDER BY 1",
            [table],
        ).fetchall()

    def constraints(table, where):
        return [
            (name, f"ALTER TABLE {table} ADD CONSTRAINT {name} {definition}")
            for name, definition in pg.execute(
                "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint "
                f"WHERE conrelid = %s::regclass AND {where} ORDER BY 1",
                [table],
            ).fetchall()
        ]

    return (
        indexes(MESSAGES),
        constraints(MESSAGES, "contype IN ('u', 'f')"),
        constraints(DOCUMENTS, "contype = 'f'"),
        indexes(DOCUMENTS),
    )


def load(n, groups=0, workers=2):
    """N messages into a new database; prints each phase's time."""
    started = time.perf_counter()
    marks = [started]

    def phase(what):
        now = time.perf_counter()
        print(f"  {what}: {now - marks[-1]:.1f} s (at {now - started:.0f} s)", flush=True)
        marks.append(now)

    def report(what):
        print(f"  {what} ({time.perf_counter() - started:.0f} s)", flush=True)

    recreate_database()
    phase("database created and migrated")
    with psycopg.connect(database_conninfo(), autocommit=True) as pg:
        indexes, constraints, document_fks, trigram = schema = deferred_schema(pg)
        for name, _sql in constraints:
            pg.execute(f"ALTER TABLE {MESSAGES} DROP CONSTRAINT {name}")
        for name, _sql in document_fks:
            pg.execute(f"ALTER TABLE {DOCUMENTS} DROP CONSTRAINT {name}")
        for name, _sql in indexes + trigram:
            pg.execute(f"DROP INDEX {name}")
        for trigger in INSERT_TRIGGERS:
            pg.execute(f"ALTER TABLE {MESSAGES} DISABLE TRIGGER {trigger}")
    print(
        f"  deferred: {len(indexes)} indexes and {len(constraints)} constraints of the "
        f"messages, the documents' trigram index and foreign key, the count triggers",
        flush=True,
    )
    insert_rows(n, datetime.datetime.now(datetime.UTC), groups, workers, report)
    phase(f"rows and their search documents ({workers} sessions)")

    # Two sessions from here. One has the indexer write a sample of the search documents again
    # to compare, and builds their trigram index (a GIN index builds in one process: the longest
    # part). The other builds the messages' indexes one at a time, takes the counts and vacuums
    # the messages.
    def documents():
        with psycopg.connect(database_conninfo(), autocommit=True) as pg:
            check_documents(pg)
            pg.execute("SET maintenance_work_mem = '2GB'")
            for _name, sql in trigram:
                pg.execute(sql)
            report("trigram index built")

    def messages():
        with psycopg.connect(database_conninfo(), autocommit=True) as pg:
            pg.execute("SET maintenance_work_mem = '1GB'")
            pg.execute("SET max_parallel_maintenance_workers = 0")
            readable_bodies_only(pg)
            for name, sql in constraints + indexes:
                pg.execute(sql)
                report(f"{name} built")
            # The counts as the triggers would have written them, folded (MessageCount's hours
            # older than a day into days) as beat's compaction leaves them.
            MessageCount.rebuild()
            MessageTotal.rebuild()
            MessageCount.compact()
            MessageTotal.compact()
            connection.close()  # this thread's own
            report("counts taken")
            # Rebuilt hourly, then folded: most of the rows written are dead. Compacted as a
            # table beat compacts every minute (and autovacuum keeps) would be, not 6x its size.
            for table in ("recovery_messagecount", "recovery_messagetotal"):
                pg.execute(f"VACUUM (FULL, ANALYZE) {table}")
            pg.execute(f"VACUUM ANALYZE {MESSAGES}")
            report(f"{MESSAGES} vacuumed")

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        for future in [pool.submit(documents), pool.submit(messages)]:
            future.result()
    phase("indexes, search documents, counts")
    with psycopg.connect(database_conninfo(), autocommit=True) as pg:
        for _name, sql in document_fks:
            pg.execute(sql)
        pg.execute(f"VACUUM ANALYZE {DOCUMENTS}")
        phase(f"{DOCUMENTS}: foreign key, VACUUM ANALYZE")
        for trigger in INSERT_TRIGGERS:  # last: a store whose triggers are on is complete
            pg.execute(f"ALTER TABLE {MESSAGES} ENABLE TRIGGER {trigger}")
        missing = [name for group in schema for name, _sql in group if not exists(pg, name)]
        assert not missing, missing
    print(f"  load: {time.perf_counter() - started:.0f} s in all", flush=True)


def exists(pg, name):
    return bool(
        pg.execute(
            "SELECT 1 FROM pg_class WHERE relname = %s UNION ALL "
            "SELECT 1 FROM pg_constraint WHERE conname = %s",
            [name, name],
        ).fetchone()
    )


def readable_bodies_only(pg):
    """ROW_SQL's documents are the indexer's only where it does not decode a body in Python
    (search_index.NEEDS_DECODING_SQL, a decoder rule): none of the bench's."""
    needs_python = pg.execute(
        f"SELECT (SELECT count(*) FROM recovery_decoderrule) + (SELECT count(*) FROM {MESSAGES} "
        f"WHERE {search_index.NEEDS_DECODING_SQL})"
    ).fetchone()[0]
    assert not needs_python, "bodies the indexer decodes in Python"


def check_documents(pg, sample=2000):
    """The indexer's own documents for a sample (the newest ids but the last, so its high-water
    mark stays): deleted, written again by ``index_new``, compared with what the load wrote."""
    top = pg.execute(f"SELECT max(id) FROM {MESSAGES}").fetchone()[0]
    low = max(top - sample - 1, 0)
    where = f"FROM {DOCUMENTS} WHERE message_id > %s AND message_id < %s"
    loaded = pg.execute(f"SELECT message_id, document {where} ORDER BY 1", [low, top]).fetchall()
    pg.execute(f"DELETE {where}", [low, top])
    search_index.index_new(budget_seconds=None)
    connection.close()  # the calling thread's own
    again = pg.execute(f"SELECT message_id, document {where} ORDER BY 1", [low, top]).fetchall()
    assert loaded == again, "the load's search documents differ from the indexer's"
    print(f"  search documents: {len(again)} written again by the indexer, equal", flush=True)


def stored_complete():
    """Whether the bench store is a finished load (its insert triggers are back on)."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT count(*) FROM pg_trigger WHERE tgrelid = %s::regclass AND tgenabled = 'D'",
            [MESSAGES],
        )
        return cur.fetchone()[0] == 0


def p95(samples):
    return statistics.quantiles(samples, n=20)[-1] if len(samples) > 1 else samples[0]


def time_requests(client, urls):
    samples = []
    for url in urls:
        started = time.perf_counter()
        response = client.get(url)
        samples.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, (url, response.status_code)
    return samples


def time_sql(pg, statements):
    samples = []
    for sql, params in statements:
        started = time.perf_counter()
        pg.execute(sql, params).fetchall()
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def scenarios(runs, rng):
    with connection.cursor() as cur:
        cur.execute("SELECT max(id), min(id) FROM recovery_message")
        top, bottom = cur.fetchone()
        cur.execute(
            "SELECT message_id FROM recovery_message TABLESAMPLE SYSTEM (1) LIMIT %s", [runs]
        )
        ids = [r[0] for r in cur.fetchall()]
        cur.execute("SELECT max(collected_at) FROM recovery_message")
        newest = cur.fetchone()[0]
    since = (newest - datetime.timedelta(days=2)).strftime("%Y-%m-%d %H:%M:%S")
    list_params = []
    for i in range(runs):
        queue = rng.choice(QUEUES)
        list_params.append(
            [
                {"queue": queue, "status": "pending"},
                {"kind": "dead_letter", "reason": rng.choice(["expired", "maxlen"])},
                {"queue": queue, "reason": "rejected", "since": since},
                {"status": "poisoned"},
                {"exchange": "shop", "kind": "unroutable"},
            ][i % 5]
        )
    pks = [rng.randint(bottom, top) for _ in range(runs)]
    return {
        "list": (
            ["/messages/?" + "&".join(f"{k}={v}" for k, v in p.items()) for p in list_params],
            [
                (
                    "SELECT id, kind, reason, source_queue, message_id, status, collected_at "
                    "FROM recovery_message WHERE "
                    + " AND ".join(
                        {
                            "queue": "source_queue",
                            "exchange": "source_exchange",
                            "since": "collected_at",
                        }.get(k, k)
                        + (" >= %s" if k == "since" else " = %s")
                        for k in p
                    )
                    + " ORDER BY collected_at DESC, id DESC LIMIT 51",
                    list(p.values()),
                )
                for p in list_params
            ],
        ),
        "search": (
            [f"/messages/?q={message_id}" for message_id in ids],
            [
                (
                    "SELECT id, kind, reason, source_queue, message_id, status, collected_at "
                    "FROM recovery_message WHERE message_id = %s "
                    "ORDER BY collected_at DESC, id DESC LIMIT 51",
                    [message_id],
                )
                for message_id in ids
            ],
        ),
        "detail": (
            [f"/messages/{pk}/" for pk in pks],
            [("SELECT * FROM recovery_message WHERE id = %s", [pk]) for pk in pks],
        ),
        "overview": (
            ["/"] * runs,
            [
                (
                    "SELECT kind, source_queue, reason, status, count(*) FROM recovery_message "
                    "GROUP BY GROUPING SETS ((kind, status), (source_queue, status), "
                    "(reason, status))",
                    [],
                )
            ]
            * max(3, runs // 10),
        ),
        "groups": (
            [
                "/api/v1/groups" + ["", "?status=pending", f"?queue={rng.choice(QUEUES)}"][i % 3]
                for i in range(runs)
            ],
            [
                (
                    "SELECT group_key, max(group_label), max(source_queue), count(*), "
                    "count(*) FILTER (WHERE status = 'pending'), min(collected_at), "
                    "max(collected_at) FROM recovery_message GROUP BY group_key",
                    [],
                )
            ]
            * max(3, runs // 10),
        ),
        "metrics": (
            ["/metrics"] * runs,
            [
                (
                    "SELECT kind, reason, status, sum(n) FROM recovery_messagetotal "
                    "GROUP BY 1, 2, 3",
                    [],
                )
            ]
            * max(3, runs // 10),
        ),
    }


def alert_cycle(runs):
    """p50, p95 (ms) of one evaluation of 20 rules over the store (the broker kinds included:
    their management API calls are part of the cycle)."""
    from recovery.alerts.engine import evaluate
    from recovery.broker.tasks import take_sample
    from recovery.models import AlertRule

    AlertRule.objects.filter(name__startswith="bench ").delete()
    take_sample()  # the broker tally rule reads the samples beat takes: two of them
    take_sample()
    kinds = [
        ("new_failure_group", {}),
        ("open_messages", {"threshold": 1000}),
        ("open_growth", {"per_minute": 100}),
        ("collector_down", {}),
        ("replay_job", {}),
        ("audit", {}),
        ("queue_without_consumers", {}),
        ("broker_alarm", {}),
        ("broker_tally", {}),
        ("collector_lag", {}),
        ("uncovered_queues", {}),
    ]
    for i in range(20):
        kind, params = kinds[i % len(kinds)]
        scope = {"queue": QUEUES[i % len(QUEUES)]} if kind.startswith(("open", "new")) else {}
        AlertRule.objects.create(name=f"bench {i}", kind=kind, params=params, **scope)
    evaluate()  # warm
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        evaluate()
        samples.append((time.perf_counter() - started) * 1000)
    AlertRule.objects.filter(name__startswith="bench ").delete()
    return statistics.median(samples), p95(samples)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("n", nargs="?", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=60)
    parser.add_argument("--reload", action="store_true")
    parser.add_argument(
        "--groups",
        type=int,
        default=0,
        help="about this many failure groups (issue #17 measures at 10000); default ~150",
    )
    parser.add_argument(
        "--masked",
        action="store_true",
        help="time only the list, detail and groups pages masked against unmasked (#32)",
    )
    parser.add_argument(
        "--load-only", action="store_true", help="load the store (if needed) and stop"
    )
    parser.add_argument("--no-teams", action="store_true", help="skip the team comparison (#31)")
    parser.add_argument(
        "--sessions", type=int, default=2, help="sessions inserting rows at once (default 2)"
    )
    args = parser.parse_args()

    ensure_database()
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM recovery_message")
        stored = cur.fetchone()[0]
        cur.execute("SELECT count(DISTINCT group_key) FROM recovery_messagecount")
        groups = cur.fetchone()[0]
    wanted = len(set(exceptions_for(args.groups))) * (len(QUEUES) * 3 + 1)
    if (
        args.reload
        or stored != args.n
        or abs(groups - wanted) > wanted // 10
        or not stored_complete()
    ):
        print(f"loading {args.n} messages (~{wanted} groups) into {BENCH_DB} ...", flush=True)
        load(args.n, args.groups, args.sessions)
    else:
        print(f"reusing {stored} messages ({groups} groups) in {BENCH_DB}", flush=True)
    if args.load_only:
        return
    MessageCount.compact()  # what Celery beat does every minute (and autovacuum after it)
    MessageTotal.compact()
    with psycopg.connect(database_conninfo(), autocommit=True) as pg:
        pg.execute("VACUUM ANALYZE recovery_messagecount")
        pg.execute("VACUUM ANALYZE recovery_messagetotal")
    print(
        f"MessageCount rows: {MessageCount.objects.count()}, "
        f"MessageTotal rows: {MessageTotal.objects.count()}",
        flush=True,
    )

    from django.contrib.auth import get_user_model

    settings.ALLOWED_HOSTS = ["testserver"]
    user, _ = get_user_model().objects.get_or_create(
        username="bench", defaults={"is_superuser": True, "is_staff": True}
    )
    client = Client()
    client.force_login(user)
    rng = random.Random(11)
    if args.masked:
        print(
            f"\n{'page':<10} {'unmasked p95':>12} {'masked p95':>10} {'ratio':>6}  "
            f"{'median ratio':>12}  (#32, {args.runs} runs each)"
        )
        for name, plain, masked in masking_comparison(client, args.runs, rng):
            print(
                f"{name:<10} {p95(plain):12.1f} {p95(masked):10.1f} "
                f"{p95(masked) / p95(plain):6.2f}  "
                f"{statistics.median(masked) / statistics.median(plain):12.2f}",
                flush=True,
            )
        return
    plan = scenarios(args.runs, rng)

    print(
        f"\n{'page':<10} {'p50 ms':>7} {'p95 ms':>7} {'target':>7} {'p95/target':>11} "
        f"{'raw p95':>8} {'page/raw':>9}"
    )
    with psycopg.connect(database_conninfo(), autocommit=True) as pg:
        for name, (urls, statements) in plan.items():
            time_requests(client, urls[:5])  # warm caches, connections, templates
            samples = time_requests(client, urls)
            page, median = p95(samples), statistics.median(samples)
            time_sql(pg, statements[:3])
            raw = p95(time_sql(pg, statements))
            target = TARGETS_MS[name]
            print(
                f"{name:<10} {median:7.1f} {page:7.1f} {target:7d} {page / target:11.2f} "
                f"{raw:8.1f} {page / raw:9.2f}",
                flush=True,
            )
    median, cycle = alert_cycle(max(10, args.runs // 3))
    print(
        f"{'alerts':<10} {median:7.1f} {cycle:7.1f} {ALERT_CYCLE_TARGET_MS:7d} "
        f"{cycle / ALERT_CYCLE_TARGET_MS:11.2f}   (one evaluation cycle of 20 rules)"
    )
    live = p95(time_requests(client, ["/overview/live"] * 20))
    print(f"\n(overview's live fragment, broker round trips: p95 {live:.1f} ms; no target)")

    if args.no_teams:
        return
    print(f"\n{'team page':<10} {'global p95':>10} {'team p95':>9} {'team/global':>12}  (#31)")
    for name, unscoped, scoped in team_comparison(args.runs, rng):
        print(f"{name:<10} {unscoped:10.1f} {scoped:9.1f} {scoped / unscoped:12.2f}", flush=True)


TEAM_QUEUES = ("orders.10", "orders.11")

# Rules that match every bench body (its customer's email, twice) and header (trace).
MASK_RULES = (
    ("json_path", "$.customer.email"),
    ("regex", r"user\d+@example\.com"),
    ("header", "trace"),
)


def masking_comparison(client, runs, rng):
    """#32: list, detail and groups URLs timed with MASK_RULES in force and without, one URL
    each in turn (the rules created and deleted between requests, untimed): (name, unmasked
    samples, masked samples) per page."""
    from recovery.models import MaskRule

    MaskRule.objects.all().delete()
    with connection.cursor() as cur:
        cur.execute("SELECT id FROM recovery_message TABLESAMPLE SYSTEM (1) LIMIT %s", [runs])
        sample = [row[0] for row in cur.fetchall()]
    lists = [
        {"status": "pending"},
        {"queue": rng.choice(QUEUES), "status": "pending"},
        {"reason": "expired"},
        {"kind": "dead_letter"},
    ]
    pages = {
        "list": [
            "/messages/?" + urllib.parse.urlencode(lists[i % len(lists)]) for i in range(runs)
        ],
        "detail": [f"/messages/{pk}/" for pk in sample],
        "groups": ["/groups/"] * runs,
    }
    results = []
    try:
        MaskRule.objects.bulk_create(MaskRule(kind=k, pattern=p) for k, p in MASK_RULES)
        shown = client.get(pages["detail"][0]).content.decode()
        assert "[masked]" in shown and "@example.com" not in shown, "the rules mask nothing"
        MaskRule.objects.all().delete()
        for name, urls in pages.items():
            time_requests(client, urls[:5])
            plain, masked = [], []
            for url in urls:
                plain += time_requests(client, [url])
                MaskRule.objects.bulk_create(MaskRule(kind=k, pattern=p) for k, p in MASK_RULES)
                masked += time_requests(client, [url])
                MaskRule.objects.all().delete()
            results.append((name, plain, masked))
    finally:
        MaskRule.objects.all().delete()
    return results


def team_comparison(runs, rng):
    """#31: the same list, search and detail URLs, inside a team's scope, timed for a member of
    that team and for a user in no team: (name, global p95, team p95) per page."""
    from django.contrib.auth import get_user_model

    from recovery.models import Membership, Team, TeamScope, set_role

    team, _ = Team.objects.get_or_create(name="bench-tenth")
    TeamScope.objects.get_or_create(team=team, vhost="/", queue_pattern="orders.1?")
    users = get_user_model().objects
    member, _ = users.get_or_create(username="bench-member")
    Membership.objects.get_or_create(user=member, team=team, defaults={"role": "viewer"})
    outsider, _ = users.get_or_create(username="bench-viewer")
    set_role(outsider, "viewer")
    with connection.cursor() as cur:
        cur.execute(
            "SELECT id, message_id FROM recovery_message TABLESAMPLE SYSTEM (2) "
            "WHERE source_queue = ANY(%s) LIMIT %s",
            [list(TEAM_QUEUES), runs],
        )
        sample = cur.fetchall()
    lists = [
        {"status": "pending"},
        {"queue": rng.choice(TEAM_QUEUES), "status": "pending"},
        {"reason": "expired"},
        {"queue": rng.choice(TEAM_QUEUES), "reason": "rejected"},
        {"kind": "dead_letter"},
    ]
    pages = {
        "list": [
            "/messages/?" + urllib.parse.urlencode(lists[i % len(lists)]) for i in range(runs)
        ],
        "search": [f"/messages/?q={message_id}" for _pk, message_id in sample],
        "detail": [f"/messages/{pk}/" for pk, _message_id in sample],
    }
    clients = {}
    for who, user in (("global", outsider), ("team", member)):
        clients[who] = Client()
        clients[who].force_login(user)
    results = []
    for name, urls in pages.items():
        timed = {"global": [], "team": []}
        for who in timed:
            time_requests(clients[who], urls[:5])
        # Interleaved, one URL each in turn: a load spike on this shared machine costs both.
        for url in urls:
            for who in timed:
                timed[who] += time_requests(clients[who], [url])
        results.append((name, p95(timed["global"]), p95(timed["team"])))
    return results


def private_vhost():
    """A wired vhost of our own, so the live fragment measures a real recovery topology."""
    vhost = f"lazarus-bench-ui-{os.getpid()}"
    management = Management()
    management.put_vhost(vhost)
    management.grant(vhost, urllib.parse.urlparse(settings.RABBITMQ_URL).username or "guest")
    base = urllib.parse.urlparse(settings.RABBITMQ_URL)
    settings.RABBITMQ_URL = base._replace(path="/" + urllib.parse.quote(vhost, safe="")).geturl()
    settings.RECOVERY_VHOSTS = [vhost]
    wire(vhost)
    return management, vhost


if __name__ == "__main__":
    if "--load-only" in sys.argv:
        sys.exit(main())
    management, vhost = private_vhost()
    try:
        main()
    finally:
        management.delete_vhost(vhost)
