"""The seeds' confirm-mode comparison, raw pika beside ReliablePublisher, in one run.

Transaction per message, confirm per message, batch confirm (publish BATCH, wait for all),
async confirm (window of WINDOW) — all with 1 KiB persistent messages to a durable queue in a
private vhost — then ReliablePublisher doing the same async work with its retry cache, audit log
and returns handling. Prints msg/s, the seeds' figures beside them, and the ratio that matters:
what the reliability costs against the raw async publisher measured in the same run.

Usage: python bench/confirm_modes.py [N]   (tx and confirm-each send N/10: they are slow)
"""

import argparse
import os
import sys
import tempfile
import time

import pika

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._vhost import private_vhost  # noqa: E402
from recovery.client import ReliablePublisher  # noqa: E402

BODY = b"x" * 1024
PROPS = pika.BasicProperties(delivery_mode=2, message_id="m")
WINDOW = 1000
BATCH = 100
SEEDS = {"tx": 1600, "confirm_each": 1900, "batch": 10400, "async": 10500}


def fresh_queue(url, name):
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    channel.queue_delete(name)
    channel.queue_declare(name, durable=True)
    connection.close()


def blocking(url, mode, n):
    fresh_queue(url, f"bench.{mode}")
    connection = pika.BlockingConnection(pika.URLParameters(url))
    channel = connection.channel()
    if mode == "tx":
        channel.tx_select()
    else:
        channel.confirm_delivery()  # BlockingChannel then waits for each ack
    started = time.perf_counter()
    for _ in range(n):
        channel.basic_publish("", f"bench.{mode}", BODY, PROPS)
        if mode == "tx":
            channel.tx_commit()
    elapsed = time.perf_counter() - started
    connection.close()
    return n / elapsed


def select_confirms(url, n, window, batch):
    """Async confirms with ``window`` in flight; with ``batch`` set, publish a batch and wait
    for every ack before the next (the Java waitForConfirms batch pattern)."""
    queue = f"bench.{'batch' if batch else 'async'}"
    fresh_queue(url, queue)
    state = {"sent": 0, "acked": 0}

    def on_open(connection):
        connection.channel(on_open_callback=on_channel)

    def on_channel(channel):
        state["channel"] = channel
        channel.confirm_delivery(on_confirm, callback=lambda _: start())

    def start():
        state["t0"] = time.perf_counter()
        pump()

    def pump():
        channel = state["channel"]
        if batch:
            if state["sent"] != state["acked"]:
                return
            limit = min(n, state["sent"] + batch)
        else:
            limit = min(n, state["acked"] + window)
        while state["sent"] < limit:
            channel.basic_publish("", queue, BODY, PROPS)
            state["sent"] += 1

    def on_confirm(frame):
        state["acked"] = frame.method.delivery_tag
        if state["acked"] >= n:
            state["t1"] = time.perf_counter()
            connection.close()
        else:
            pump()

    connection = pika.SelectConnection(
        pika.URLParameters(url),
        on_open_callback=on_open,
        on_close_callback=lambda *_: connection.ioloop.stop(),
    )
    connection.ioloop.start()
    return n / (state["t1"] - state["t0"])


def reliable(url, n):
    fresh_queue(url, "bench.reliable")
    with tempfile.TemporaryDirectory() as log_dir:
        publisher = ReliablePublisher(
            url, producer="bench", log_dir=log_dir, window=WINDOW, returns_queue="bench.returns"
        )
        time.sleep(0.3)  # let it connect: the raw runs do not time their connection either
        started = time.perf_counter()
        for _ in range(n):
            publisher.publish("", "bench.reliable", BODY, PROPS)
        publisher.flush()
        elapsed = time.perf_counter() - started
        publisher.close()
    return n / elapsed


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "n", type=int, nargs="?", default=50000, help="messages (default %(default)s)"
    )
    n = parser.parse_args().n
    with private_vhost("lazarus-bench-confirm") as url:
        rows = [
            ("transaction per message", "tx", blocking(url, "tx", n // 10)),
            ("confirm per message", "confirm_each", blocking(url, "confirm_each", n // 10)),
            (f"batch confirm ({BATCH})", "batch", select_confirms(url, n, WINDOW, BATCH)),
            (f"async confirm (window {WINDOW})", "async", select_confirms(url, n, WINDOW, None)),
        ]
        ours = reliable(url, n)
    raw_async = rows[-1][2]
    print(f"{n} persistent 1 KiB messages (tx and confirm-each: {n // 10})")
    print(f"{'mode':34} {'raw pika':>10} {'seeds':>10}")
    for label, key, rate in rows:
        print(f"{label:34} {rate:10.0f} {SEEDS[key]:10d}")
    print(f"{'ReliablePublisher (async)':34} {ours:10.0f} {'':>10}")
    print(f"ReliablePublisher async / raw async = {ours / raw_async:.2f}")


if __name__ == "__main__":
    main()
