"""Capture what the real instrumentations emit, into tests/telemetry/fixtures/ (#47).

    .venv/bin/python -m tests.telemetry.services.capture [--vhost lazarus-capture]

Against the real RabbitMQ (a vhost of its own, deleted at the end): a consumer (group
``billing``, queue ``orders.billing`` bound to the topic exchange ``orders`` with
``orders.created``) that rejects (requeue=False) every second message, and a producer that
publishes 6 messages with publisher confirms, ids ``m-1``..``m-6`` except every third (``m-3``,
``m-6`` have no ``message_id``). Both export over OTLP/HTTP protobuf to a local capture sink; the
captured requests are written as one OTLP JSON document per instrumentation, with the services'
own records beside them (``*.record.jsonl``). ``amqplib_publish_consume_links`` is the Node
service with the instrumentation's ``useLinksForConsume: true``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from tests.telemetry.services import harness

FIXTURES = Path(__file__).parent.parent / "fixtures"


def capture(language, vhost, workdir, **consumer_options):
    workdir.mkdir()
    harness.put_vhost(vhost)
    try:
        with harness.CaptureSink() as sink:
            ready = workdir / f"{language}.ready"
            record = workdir / f"{language}.record.jsonl"
            common = {
                "amqp_url": harness.amqp_url(vhost),
                "otlp_endpoint": sink.endpoint,
                "record": record,
            }
            consumer = harness.start_service(
                language,
                "consume",
                queue="orders.billing",
                group="billing",
                declare=True,
                reject="every:2",
                idle=1.5,
                ready_file=ready,
                service_name=f"{language}-billing",
                **common,
                **consumer_options,
            )
            harness.wait_until(ready.exists, what="the consumer")
            producer = harness.start_service(
                language,
                "produce",
                exchange="orders",
                declare=True,
                count=6,
                id_prefix="m-",
                no_id_every=3,
                service_name=f"{language}-orders",
                **common,
            )
            harness.finish(producer)
            harness.finish(consumer)
            document = sink.otlp_json()
            requests = [
                (path, content_type, encoding) for path, content_type, encoding, _ in sink.requests
            ]
        return document, harness.read_record(record), requests
    finally:
        harness.delete_vhost(vhost)


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--vhost", default="lazarus-capture")
    parser.add_argument("--out", type=Path, default=FIXTURES)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for language, name, options in (
            ("python", "pika_publish_consume", {}),
            ("node", "amqplib_publish_consume", {}),
            # The same, the instrumentation configured with useLinksForConsume: true.
            ("node", "amqplib_publish_consume_links", {"use_links": True}),
        ):
            document, record, requests = capture(language, args.vhost, Path(tmp) / name, **options)
            (args.out / f"{name}.json").write_text(
                json.dumps(document, indent=1, sort_keys=True) + "\n"
            )
            (args.out / f"{name}.record.jsonl").write_text(
                "".join(json.dumps(line, sort_keys=True) + "\n" for line in record)
            )
            spans = list(harness.iter_spans(document))
            print(f"{name}: {len(requests)} requests {sorted(set(requests))}, {len(spans)} spans")


if __name__ == "__main__":
    main()
