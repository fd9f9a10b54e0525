"""The fastest honest drain of a dead-letter queue into PostgreSQL on this machine.

Fills a DLQ with N 1 KiB messages that carry an x-death header (via a real reject-to-DLX),
then drains it: consume (prefetch 2000), batch 500, COPY into a table, commit, multiple-ack.
At-least-once: acks only after commit. Prints the drain rate in msg/s.
Usage: RABBITMQ_URL=... BASELINE_DATABASE_URL=... python drain_baseline.py [N]
"""

import json
import sys
import time

import pika
import psycopg

N = int(sys.argv[1]) if len(sys.argv) > 1 else 50000
import os

params = pika.URLParameters(os.environ.get("RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/%2F"))
conn = pika.BlockingConnection(params)
ch = conn.channel()
for q in ("bl.work", "bl.dlq"):
    ch.queue_delete(q)
ch.exchange_declare("bl.dlx", "fanout", durable=True)
ch.queue_declare("bl.dlq", durable=True)
ch.queue_bind("bl.dlq", "bl.dlx")
ch.queue_declare(
    "bl.work", durable=True, arguments={"x-dead-letter-exchange": "bl.dlx", "x-message-ttl": 0}
)
body = b"y" * 1024
t = time.perf_counter()
for i in range(N):
    ch.basic_publish("", "bl.work", body, pika.BasicProperties(delivery_mode=2, message_id=f"m{i}"))
while ch.queue_declare("bl.dlq", passive=True).method.message_count < N:
    time.sleep(0.2)
print(f"fill (ttl=0 expiry to DLX) {N / (time.perf_counter() - t):9.0f} msg/s")

pg = psycopg.connect(
    os.environ.get("BASELINE_DATABASE_URL", "postgresql://postgres@127.0.0.1/postgres")
)
pg.execute(
    "DROP TABLE IF EXISTS bl_dead; CREATE TABLE bl_dead (id bigserial primary key, message_id text, queue text, reason text, headers jsonb, body bytea, collected timestamptz default now())"
)
pg.commit()
ch.basic_qos(prefetch_count=2000)
got, batch, last = 0, [], None
t = time.perf_counter()


def flush():
    global batch
    with (
        pg.cursor() as cur,
        cur.copy("COPY bl_dead (message_id, queue, reason, headers, body) FROM STDIN") as cp,
    ):
        for row in batch:
            cp.write_row(row)
    pg.commit()
    ch.basic_ack(last, multiple=True)
    batch = []


for method, props, b in ch.consume("bl.dlq", inactivity_timeout=2):
    if method is None:
        break
    death = props.headers["x-death"][0]
    batch.append(
        (
            props.message_id,
            death["queue"],
            death["reason"],
            json.dumps({k: str(v) for k, v in props.headers.items()}),
            b,
        )
    )
    last = method.delivery_tag
    got += 1
    if len(batch) >= 500:
        flush()
    if got >= N:
        break
if batch:
    flush()
dt = time.perf_counter() - t
print(f"drain DLQ -> PG (COPY, ack after commit) {got / dt:9.0f} msg/s ({got} msgs)")
