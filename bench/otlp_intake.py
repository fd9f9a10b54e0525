"""The span intake (#47): ``POST /v1/traces`` served by the real gunicorn (production settings,
one worker, one thread) taking OTLP/protobuf batches from a keep-alive HTTP client, against
``baselines/otlp_baseline.py``'s bare decode-and-write of the same batches to Parquet in this
process (protobuf + pyarrow, each file fsynced: the intake's durability). Alternating rounds;
prints intake / baseline per round, the median and the best.

    .venv/bin/python bench/otlp_intake.py [--batches 100] [--spans 2048] [--rounds 3] [--gzip]

Each batch is half producer spans (current and old messaging conventions alternating), half
consumer spans with their parent, 8 attributes each, one service per batch: what an SDK's
``BatchSpanProcessor`` or the Collector's ``batch`` processor sends. A private database
(``BENCH_DATABASE_URL``, default ``lazarus_bench_otlp``) holds the token.
"""

import argparse
import gzip
import http.client
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent / "baselines"))

from _django import setup_django  # noqa: E402

BENCH_DB = setup_django("lazarus_bench_otlp")

import otlp_baseline  # noqa: E402
import psycopg  # noqa: E402
from django.core.management import call_command  # noqa: E402
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (  # noqa: E402
    ExportTraceServiceRequest,
)

ROOT = Path(__file__).resolve().parent.parent
START = 1_796_000_000_000_000_000


def ensure_database():
    from urllib.parse import urlparse

    parsed = urlparse(BENCH_DB)
    name = parsed.path.lstrip("/")
    with psycopg.connect(parsed._replace(path="/postgres").geturl(), autocommit=True) as pg:
        if not pg.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            pg.execute(f'CREATE DATABASE "{name}"')
    call_command("migrate", verbosity=0)


def token():
    from django.contrib.auth import get_user_model

    from recovery.models import ApiToken, set_role

    user, _ = get_user_model().objects.get_or_create(username="bench-otlp")
    set_role(user, "operator")
    return ApiToken.issue(user, name="bench")[1]


def attribute(span, key, value):
    kv = span.attributes.add()
    kv.key = key
    if isinstance(value, int):
        kv.value.int_value = value
    else:
        kv.value.string_value = value


def batch(number, size):
    request = ExportTraceServiceRequest()
    resource_spans = request.resource_spans.add()
    kv = resource_spans.resource.attributes.add()
    kv.key, kv.value.string_value = "service.name", f"service-{number % 7}"
    scope = resource_spans.scope_spans.add()
    scope.scope.name = "opentelemetry.instrumentation.pika"
    for n in range(size // 2):
        seq = number * size + n
        trace_id = seq.to_bytes(16, "big")
        start = START + seq * 1_000_000
        producer = scope.spans.add()
        producer.trace_id, producer.span_id = trace_id, (2 * seq + 1).to_bytes(8, "big")
        producer.name, producer.kind = "orders send", 4
        producer.start_time_unix_nano, producer.end_time_unix_nano = start, start + 400_000
        if n % 2:
            for key, value in (
                ("messaging.system", "rabbitmq"),
                ("messaging.operation.type", "send"),
                ("messaging.destination.name", "orders"),
                ("messaging.rabbitmq.destination.routing_key", "orders.created"),
                ("messaging.message.id", f"m-{seq}"),
                ("server.address", "rabbit-1"),
                ("server.port", 5672),
                ("network.protocol.name", "amqp"),
            ):
                attribute(producer, key, value)
        else:
            for key, value in (
                ("messaging.system", "rabbitmq"),
                ("messaging.operation", "publish"),
                ("messaging.destination", "orders"),
                ("messaging.rabbitmq.routing_key", "orders.created"),
                ("messaging.message_id", f"m-{seq}"),
                ("net.peer.name", "rabbit-1"),
                ("net.peer.port", 5672),
                ("messaging.protocol", "AMQP"),
            ):
                attribute(producer, key, value)
        consumer = scope.spans.add()
        consumer.trace_id, consumer.span_id = trace_id, (2 * seq + 2).to_bytes(8, "big")
        consumer.parent_span_id = producer.span_id
        consumer.name, consumer.kind = "orders.billing process", 5
        consumer.start_time_unix_nano = start + 2_000_000
        consumer.end_time_unix_nano = start + 3_000_000
        for key, value in (
            ("messaging.system", "rabbitmq"),
            ("messaging.operation.type", "process"),
            ("messaging.destination.name", "orders"),
            ("messaging.rabbitmq.destination.routing_key", "orders.created"),
            ("messaging.message.id", f"m-{seq}"),
            ("messaging.consumer.group.name", "billing"),
            ("messaging.rabbitmq.message.delivery_tag", n + 1),
            ("server.address", "rabbit-1"),
        ):
            attribute(consumer, key, value)
    return request.SerializeToString()


class Gunicorn:
    def __init__(self, spans_dir):
        from tests.helpers import free_port

        self.port = free_port()
        self.env = {
            **os.environ,
            "DATABASE_URL": BENCH_DB,
            "DEBUG": "false",
            "SECRET_KEY": secrets.token_urlsafe(50),
            "ALLOWED_HOSTS": "127.0.0.1",
            "PORT": str(self.port),
            "BIND_ADDRESS": "127.0.0.1",
            "WEB_CONCURRENCY": "1",
            "GUNICORN_THREADS": "1",
            "AUDIT_SPANS": str(spans_dir),
        }

    def __enter__(self):
        subprocess.run(
            [sys.executable, "manage.py", "collectstatic", "--noinput", "-v", "0"],
            cwd=ROOT,
            env=self.env,
            check=True,
        )
        self.process = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "gunicorn"),
                "console.wsgi",
                "-c",
                "deploy/gunicorn.conf.py",
            ],
            cwd=ROOT,
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/livez", timeout=2):
                    return self
            except OSError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise RuntimeError("gunicorn did not start") from None
                time.sleep(0.2)

    def __exit__(self, *exc):
        self.process.terminate()
        self.process.wait(30)


def post_all(port, key, bodies, compressed):
    headers = {"Content-Type": "application/x-protobuf", "Authorization": f"Bearer {key}"}
    if compressed:
        headers["Content-Encoding"] = "gzip"
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    started = time.perf_counter()
    for body in bodies:
        connection.request("POST", "/v1/traces", body=body, headers=headers)
        response = connection.getresponse()
        answer = response.read()
        if response.status != 200:
            raise RuntimeError(f"the intake answered {response.status}: {answer[:300]!r}")
    seconds = time.perf_counter() - started
    connection.close()
    return seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=100)
    parser.add_argument("--spans", type=int, default=2048, help="spans per batch")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--gzip", action="store_true", help="send the batches gzip-compressed")
    args = parser.parse_args()
    ensure_database()
    key = token()
    bodies = [batch(n, args.spans) for n in range(args.batches)]
    sent = [gzip.compress(b, 1) for b in bodies] if args.gzip else bodies
    total = args.batches * (args.spans // 2) * 2
    size = f"{sum(map(len, bodies)) / 1e6:.1f} MB protobuf"
    if args.gzip:
        size += f", {sum(map(len, sent)) / 1e6:.1f} MB gzip"
    print(f"{args.batches} batches of {args.spans} spans ({size})")
    work = Path(tempfile.mkdtemp(prefix="lazarus-bench-otlp-"))
    ratios = []
    try:
        with Gunicorn(work / "spans") as server:
            post_all(server.port, key, sent[:3], args.gzip)  # warm: imports, connections
            for round_number in range(1, args.rounds + 1):
                shutil.rmtree(work / "baseline", ignore_errors=True)
                spans, base_seconds = otlp_baseline.run(bodies, work / "baseline")
                assert spans == total
                shutil.rmtree(work / "spans", ignore_errors=True)
                intake_seconds = post_all(server.port, key, sent, args.gzip)
                kept = sum(1 for _ in (work / "spans").rglob("spans-*.parquet"))
                ratio = base_seconds / intake_seconds
                ratios.append(ratio)
                print(
                    f"round {round_number}: intake {total / intake_seconds:,.0f} spans/s "
                    f"({kept} files), baseline {total / base_seconds:,.0f} spans/s: "
                    f"intake / baseline {ratio:.2f}"
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(
        f"intake / baseline: median {statistics.median(ratios):.2f}, best {max(ratios):.2f} "
        f"of {len(ratios)} rounds (target >= 0.8)"
    )


if __name__ == "__main__":
    main()
