"""The two sides of the collector race, each run as its own process by bench/collector.py --race.

    python -m bench._race reject URL QUEUE N
        A consumer that starts failing: consumes N messages from QUEUE (prefetch 2000) and
        ``basic.nack(multiple=True, requeue=False)`` every 1,000, so the broker dead-letters them
        while the collector drains.
    python -m bench._race raw-drain URL DLQ N DATABASE_URL
        The raw contestant, written the way bench/baselines/drain_baseline.py drains (prefetch
        2000, COPY 500 rows, commit, multiple-ack), on a quorum DLQ like recovery.dead_letters.

Both print ``ready`` once they consume, so the parent starts its clock on work, not on imports.
"""

import json
import sys

import pika
import psycopg

NACK_EVERY = 1000
PREFETCH = 2000
COPY_ROWS = 500


def reject(url, queue, n):
    conn = pika.BlockingConnection(pika.URLParameters(url))
    channel = conn.channel()
    channel.basic_qos(prefetch_count=PREFETCH)
    print("ready", flush=True)
    got, last = 0, None
    for method, _props, _body in channel.consume(queue, inactivity_timeout=30):
        if method is None:
            raise SystemExit(f"reject: stalled at {got}/{n}")
        got, last = got + 1, method.delivery_tag
        if got % NACK_EVERY == 0 or got >= n:
            channel.basic_nack(last, multiple=True, requeue=False)
        if got >= n:
            break
    channel.cancel()
    conn.close()


def raw_drain(url, dlq, n, database_url):
    pg = psycopg.connect(database_url)
    pg.execute(
        "DROP TABLE IF EXISTS race_dead; CREATE TABLE race_dead (id bigserial primary key, "
        "message_id text, queue text, reason text, headers jsonb, body bytea, "
        "collected timestamptz default now())"
    )
    pg.commit()
    conn = pika.BlockingConnection(pika.URLParameters(url))
    channel = conn.channel()
    channel.basic_qos(prefetch_count=PREFETCH)
    batch, got, last = [], 0, None

    def flush():
        with (
            pg.cursor() as cur,
            cur.copy(
                "COPY race_dead (message_id, queue, reason, headers, body) FROM STDIN"
            ) as copy,
        ):
            for row in batch:
                copy.write_row(row)
        pg.commit()
        channel.basic_ack(last, multiple=True)
        batch.clear()

    print("ready", flush=True)
    for method, props, body in channel.consume(dlq, inactivity_timeout=30):
        if method is None:
            raise SystemExit(f"raw-drain: stalled at {got}/{n}")
        death = props.headers["x-death"][0]
        headers = json.dumps({k: str(v) for k, v in props.headers.items()})
        batch.append((props.message_id, death["queue"], death["reason"], headers, body))
        got, last = got + 1, method.delivery_tag
        if len(batch) >= COPY_ROWS or got >= n:
            flush()
        if got >= n:
            break
    channel.cancel()
    conn.close()
    pg.close()
    print(f"done {got}", flush=True)


if __name__ == "__main__":
    command, args = sys.argv[1], sys.argv[2:]
    if command == "reject":
        reject(args[0], args[1], int(args[2]))
    elif command == "raw-drain":
        raw_drain(args[0], args[1], int(args[2]), args[3])
    else:
        raise SystemExit(f"unknown command {command!r}")
