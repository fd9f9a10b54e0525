"""Readable bodies cost the collector nothing: a drain of gzip+protobuf bodies against the same
drain of plain JSON bodies, and the search indexer (which decodes) behind each.

    .venv/bin/python bench/bodies.py [N]     # default 30000 per kind, --rounds 3

Per round and kind: N real dead letters (TTL-0 expiry into recovery.dlx, as bench/collector.py
fills them) whose bodies are the same order as plain JSON (~300 B) or as a gzip-compressed
protobuf (content_encoding gzip, type orders.v1.OrderCreated, a decoder rule for the queue
with a FileDescriptorSet compiled by protoc), drained by a real ``celery -A console worker
--collector`` (bench/collector.py's ``drain``), then indexed by ``recovery.search.index``
(which decodes the protobuf ones). Prints each round's rates and ``protobuf / json`` for the
drain (target >= 0.9: decoding must stay out of the collector's hot path) and for the indexer,
then the median of the rounds beside the best. The baseline is the plain JSON drain of the same
run, on the same machine. Prints, never asserts.
"""

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pika  # noqa: E402
from django.conf import settings  # noqa: E402
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory  # noqa: E402

from bench import collector as bench  # noqa: E402  (sets up Django on the bench database)
from recovery.broker.management import Management  # noqa: E402
from recovery.broker.topology import wire  # noqa: E402
from recovery.models import DecoderRule  # noqa: E402

PROTO = """
syntax = "proto3";
package orders.v1;
message OrderCreated { string order_id = 1; double amount = 2; repeated string skus = 3;
                       string customer = 4; string note = 5; }
"""


def compile_proto():
    with tempfile.TemporaryDirectory() as folder:
        Path(folder, "orders.proto").write_text(PROTO)
        out = Path(folder, "orders.desc")
        subprocess.run(
            [
                sys.executable,
                "-m",
                "grpc_tools.protoc",
                f"-I{folder}",
                f"--descriptor_set_out={out}",
                "--include_imports",
                str(Path(folder, "orders.proto")),
            ],
            check=True,
        )
        data = out.read_bytes()
    pool = descriptor_pool.DescriptorPool()
    for file in descriptor_pb2.FileDescriptorSet.FromString(data).file:
        pool.Add(file)
    return data, message_factory.GetMessageClass(
        pool.FindMessageTypeByName("orders.v1.OrderCreated")
    )


def order(i):
    return {
        "order_id": f"ord-{i:08d}",
        "amount": 10.0 + i % 1000,
        "skus": [f"SKU-{i % 97}", f"SKU-{i % 89}", f"SKU-{i % 83}"],
        "customer": f"customer-{i % 5000}@example.com",
        "note": "deliver to the back door, ring twice " * 4,
    }


def fill(vhost, n, kind, cls):
    conn = pika.BlockingConnection(pika.URLParameters(bench.vhost_url(vhost)))
    channel = conn.channel()
    queue = f"bench.bodies.{kind}"
    channel.queue_delete(queue)
    channel.queue_declare(
        queue,
        durable=True,
        arguments={"x-dead-letter-exchange": settings.RECOVERY_DLX, "x-message-ttl": 0},
    )
    sizes = []
    for i in range(n):
        value = order(i)
        if kind == "json":
            body, props = json.dumps(value).encode(), {"content_type": "application/json"}
        else:
            body = gzip.compress(cls(**value).SerializeToString())
            props = {"content_encoding": "gzip", "type": "orders.v1.OrderCreated"}
        sizes.append(len(body))
        channel.basic_publish(
            "",
            queue,
            body,
            pika.BasicProperties(delivery_mode=2, message_id=f"{kind}-{i}", **props),
        )
        if i % 20000 == 19999:
            conn.process_data_events(0)
    while channel.queue_declare(bench.DLQ, passive=True).method.message_count < n:
        conn.sleep(0.2)
    conn.close()
    return statistics.mean(sizes)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("n", nargs="?", type=int, default=30_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    worker_args = argparse.Namespace(
        in_process=False, prefetch=None, batch=None, processes=None, as_run=False
    )
    bench.ensure_database()
    descriptor_set, cls = compile_proto()
    DecoderRule.objects.all().delete()
    DecoderRule.objects.create(
        name="bench protobuf",
        queue_pattern="bench.bodies.protobuf",
        decoder="protobuf",
        descriptor_set=descriptor_set,
    )
    management = Management()
    vhost = f"lazarus-bench-{os.getpid()}"
    bench.make_vhost(management, vhost)
    drains, indexes = [], []
    try:
        wire(vhost)
        print(f"{args.n} dead letters per kind, {args.rounds} round(s)")
        for round_ in range(1, args.rounds + 1):
            rates = {}
            for kind in ("json", "protobuf"):
                size = fill(vhost, args.n, kind, cls)
                drain_rate, _samples, cpu = bench.drain(vhost, args.n, worker_args)
                index_rate = bench.index_drained()
                rates[kind] = (drain_rate, index_rate)
                print(
                    f"  round {round_} {kind:8} ({size:4.0f} B bodies): drain {drain_rate:7.0f}"
                    f" msg/s (collector CPU {cpu['collector']:.0f} us/msg), indexer"
                    f" {index_rate:7.0f} msg/s"
                )
            drains.append(rates["protobuf"][0] / rates["json"][0])
            indexes.append(rates["protobuf"][1] / rates["json"][1])
            print(
                f"  round {round_}: drain protobuf / json = {drains[-1]:.2f}, "
                f"indexer protobuf / json = {indexes[-1]:.2f}"
            )
    finally:
        management.delete_vhost(vhost)
        DecoderRule.objects.filter(name="bench protobuf").delete()
    print(
        f"drain gzip+protobuf / plain JSON: median {statistics.median(drains):.2f}, best "
        f"{max(drains):.2f} (rounds {', '.join(f'{r:.2f}' for r in drains)}; target >= 0.9)"
    )
    print(
        f"indexer gzip+protobuf / plain JSON: median {statistics.median(indexes):.2f}, best "
        f"{max(indexes):.2f} (rounds {', '.join(f'{r:.2f}' for r in indexes)})"
    )


if __name__ == "__main__":
    main()
