"""The audit of a day from spans only (#47): real services nobody here wrote the telemetry of
(pika with opentelemetry-instrumentation-pika), exporting to Lazarus's intake, against the real
broker with faults injected there; the nightly audit of the day names the injected losses, with
the ids, and which of them Lazarus holds.

Two consumer groups, each with its own exchange (pika's instrumentation records no routing key:
on one exchange with a key per group, the audit could not tell whose a message was, see
docs/audit.md), each queue with a 1 s TTL: ``billing``'s queue
dead-letters into Lazarus (the collector stores what expires), ``refunds``' has no dead-letter
exchange. Messages published while the consumers are down expire: billing's are recoverable
(in the store, with their store ids), refunds' are truly lost, and since a span cannot say the
broker confirmed a publish, they are ``lost_confirmation_unknown``, never a plain ``lost``.
Messages published with the consumers up are delivered and fine.
"""

import pika
import pytest
from django.conf import settings
from django.utils import timezone

from recovery.access.models import ApiToken
from recovery.audit.run import run_audit
from recovery.models import Message
from tests.helpers import make_user, wait_for
from tests.helpers.audit import evidence_ids, next_morning
from tests.telemetry.services import harness

pytestmark = [pytest.mark.slow, pytest.mark.spark]

# service (its group: no instrumentation sets one) -> (exchange, queue, routing key, DLX)
GROUPS = {
    "py-billing": ("otel.orders", "otel.billing", "orders.created", True),
    "py-refunds": ("otel.refunds", "otel.refunds", "orders.refund", False),
}


def declare(channel):
    for exchange, queue, routing_key, dead_letters in GROUPS.values():
        channel.exchange_declare(exchange, "topic", durable=True)
        channel.queue_delete(queue)
        arguments = {"x-message-ttl": 1000}  # 1 s: a busy machine still delivers in time
        if dead_letters:
            arguments["x-dead-letter-exchange"] = settings.RECOVERY_DLX
        channel.queue_declare(queue, durable=True, arguments=arguments)
        channel.queue_bind(queue, exchange, routing_key)


def produce(amqp_url, endpoint, header, group, prefix, count, workdir):
    exchange, _, routing_key, _ = GROUPS[group]
    producer = harness.start_service(
        "python",
        "produce",
        amqp_url=amqp_url,
        otlp_endpoint=endpoint,
        header=[header],
        exchange=exchange,
        routing_key=routing_key,
        count=count,
        id_prefix=prefix,
        service_name="py-orders",
        record=workdir / f"produce-{prefix}.jsonl",
    )
    harness.finish(producer)


def test_a_day_of_spans_names_the_recoverable_and_the_truly_lost(live_server, collector, tmp_path):
    key = ApiToken.issue(make_user("exporter", "operator"))[1]
    header = f"Authorization=Bearer {key}"
    endpoint = live_server.url + "/v1/traces"
    amqp_url = settings.RABBITMQ_URL
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    declare(connection.channel())
    connection.close()

    # The consumers are down: what is published now expires after 1 s.
    produce(amqp_url, endpoint, header, "py-billing", "p-", 4, tmp_path)
    produce(amqp_url, endpoint, header, "py-refunds", "r-", 4, tmp_path)
    wait_for(
        lambda: Message.objects.filter(message_id__startswith="p-").count() == 4,
        timeout=20,
        message="billing's expired messages in the store",
    )
    channel = pika.BlockingConnection(pika.URLParameters(amqp_url)).channel()
    for _, queue, _, _ in GROUPS.values():  # refunds' expired too, into nowhere
        wait_for(
            lambda q=queue: channel.queue_declare(q, passive=True).method.message_count == 0,
            timeout=20,
            message=f"{queue} to expire its messages",
        )
    channel.connection.close()

    # The consumers are up: everything published now is delivered.
    consumers = []
    for service, (_, queue, _, _) in GROUPS.items():
        ready = tmp_path / f"{service}.ready"
        consumers.append(
            harness.start_service(
                "python",
                "consume",
                amqp_url=amqp_url,
                otlp_endpoint=endpoint,
                header=[header],
                queue=queue,
                idle=1.5,
                expect=6,
                ready_file=ready,
                service_name=service,
                record=tmp_path / f"{service}.jsonl",
            )
        )
        harness.wait_until(ready.exists, what=f"{service}'s consumer")
    produce(amqp_url, endpoint, header, "py-billing", "m-", 6, tmp_path)
    produce(amqp_url, endpoint, header, "py-refunds", "n-", 6, tmp_path)
    for consumer in consumers:
        harness.finish(consumer)

    today = timezone.now().date()
    # As bound, but "#": the spans carry no routing key to match a binding's.
    bindings = [
        {"exchange": exchange, "routing_key": "#", "consumer_group": service}
        for service, (exchange, _, _, _) in GROUPS.items()
    ]
    run = run_audit(
        today,
        producer_logs=str(tmp_path / "no-producer-logs"),
        consumer_logs=str(tmp_path / "no-consumer-logs"),
        bindings=bindings,
        now=next_morning(today),
        master="local[1]",
    )
    assert run.status == "succeeded", run.error
    evidence = evidence_ids(run)
    stored = dict(
        Message.objects.filter(message_id__startswith="p-").values_list("message_id", "pk")
    )
    assert evidence.get("recoverable") == set(stored), evidence
    assert {
        row.message_id: row.store_id for row in run.evidence.filter(kind="recoverable")
    } == stored
    assert evidence.get("lost_confirmation_unknown") == {f"r-{n}" for n in range(1, 5)}
    assert "lost" not in evidence  # a span never says "confirmed": nothing is a plain loss
    # Each row names what the audit read: spans for both sides, no log.
    sources = set(run.evidence.values_list("producer_source", "consumer_source"))
    assert sources == {("span", "span")}, sources
    totals = run.totals
    assert totals["recoverable"] == 4 and totals["lost_confirmation_unknown"] == 4
    assert totals["sent"] == totals["distinct_published"] == 20
    assert totals["delivered_unique"] == 12
    assert run.outcome == "succeeded_with_warnings"  # confirmation unknown is a warning
