"""Raw RabbitMQ throughput on this machine: the 'physical limit' the project is compared with.

Publishes N persistent 1 KiB messages to a durable queue in each confirm mode the seeds
compare (none, tx, per-message confirm, async confirm window), then consumes them with
manual acks (prefetch + multiple ack). Prints one line per mode: msgs/s.
Usage: python broker_baseline.py [N]
"""

import sys
import time

import pika

N = int(sys.argv[1]) if len(sys.argv) > 1 else 50000
BODY = b"x" * 1024
PROPS = pika.BasicProperties(delivery_mode=2, message_id="m")
import os

params = pika.URLParameters(os.environ.get("RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/%2F"))


def fresh(ch, q):
    ch.queue_delete(q)
    ch.queue_declare(q, durable=True)


def blocking(mode, n):
    conn = pika.BlockingConnection(params)
    ch = conn.channel()
    q = f"bl.{mode}"
    fresh(ch, q)
    if mode == "tx":
        ch.tx_select()
    if mode == "confirm_each":
        ch.confirm_delivery()
    t = time.perf_counter()
    for i in range(n):
        ch.basic_publish("", q, BODY, PROPS)
        if mode == "tx":
            ch.tx_commit()
    if mode == "none":
        ch.queue_declare(q, passive=True)  # round trip so all frames were taken
    dt = time.perf_counter() - t
    conn.close()
    return n / dt, q


def async_confirm(n, window=1000):
    q = "bl.async"
    state = {"sent": 0, "acked": 0, "t": None, "done": None}

    def on_open(conn):
        conn.channel(on_open_callback=on_channel)

    def on_channel(ch):
        state["ch"] = ch
        ch.queue_delete(
            q,
            callback=lambda _: ch.queue_declare(
                q,
                durable=True,
                callback=lambda _: ch.confirm_delivery(on_confirm, callback=lambda _: start()),
            ),
        )

    def start():
        state["t"] = time.perf_counter()
        pump()

    def pump():
        ch = state["ch"]
        while state["sent"] < n and state["sent"] - state["acked"] < window:
            ch.basic_publish("", q, BODY, PROPS)
            state["sent"] += 1

    def on_confirm(frame):
        m = frame.method
        if m.multiple:
            state["acked"] = m.delivery_tag
        else:
            state["acked"] = max(state["acked"], m.delivery_tag)
        if state["acked"] >= n:
            state["done"] = time.perf_counter()
            conn.close()
        else:
            pump()

    conn = pika.SelectConnection(params, on_open_callback=on_open)
    conn.ioloop_stop = None

    def on_close(*a):
        conn.ioloop.stop()

    conn.add_on_close_callback(on_close)
    conn.ioloop.start()
    return n / (state["done"] - state["t"]), q


def consume(q, n, prefetch=500):
    conn = pika.BlockingConnection(params)
    ch = conn.channel()
    ch.basic_qos(prefetch_count=prefetch)
    got = 0
    t = time.perf_counter()
    for method, props, body in ch.consume(q, inactivity_timeout=5):
        if method is None:
            break
        got += 1
        if got % 100 == 0 or got == n:
            ch.basic_ack(method.delivery_tag, multiple=True)
        if got >= n:
            break
    dt = time.perf_counter() - t
    ch.cancel()
    conn.close()
    return got / dt, got


if __name__ == "__main__":
    r, _ = blocking("none", N)
    print(f"publish no-confirm      {r:9.0f} msg/s")
    r, _ = blocking("tx", N // 10)
    print(f"publish tx-per-msg      {r:9.0f} msg/s")
    r, _ = blocking("confirm_each", N // 10)
    print(f"publish confirm-each    {r:9.0f} msg/s")
    r, q = async_confirm(N)
    print(f"publish async-confirm   {r:9.0f} msg/s")
    r, got = consume(q, N)
    print(f"consume manual-ack      {r:9.0f} msg/s ({got} msgs)")
