"""Schema'd bodies through the real broker and store: Protocol Buffers from a descriptor set an
admin uploads, Avro from an uploaded schema and from a schema registry; shown decoded, found by
a value inside, edited decoded, replayed, and consumed back as the edited value."""

import gzip
import html
import io
import json
import socket
import struct
import time

import fastavro
import pytest
import zstandard
from django.core.files.uploadedfile import SimpleUploadedFile

from recovery.models import Activity, DecoderRule, Message
from recovery.search import index as search_index
from recovery.search.filters import MessageFilterForm
from tests.helpers import declare_app_queue, publish, wait_for
from tests.helpers.bodies import AVRO_SCHEMA

pytestmark = pytest.mark.django_db(transaction=True)


def search(text):
    form = MessageFilterForm({"q": text})
    assert form.is_valid(), form.errors
    return sorted(form.apply().values_list("message_id", flat=True))


def dead_letter(amqp, queue, body, message_id, **props):
    """Publish to an application queue, reject it into recovery.dlx, wait until stored."""
    declare_app_queue(amqp, queue)
    publish(amqp, queue, body, message_id=message_id, **props)
    method = wait_for(lambda: amqp.basic_get(queue)[0], message=f"a delivery on {queue}")
    amqp.basic_reject(method.delivery_tag, requeue=False)
    return wait_for(
        lambda: Message.objects.filter(message_id=message_id).first(),
        message=f"{message_id} stored",
    )


def consume(amqp, queue):
    def get():
        method, props, body = amqp.basic_get(queue, auto_ack=True)
        return (props, body) if method else None

    return wait_for(get, message=f"a message on {queue}")


def avro_bytes(value):
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(AVRO_SCHEMA), value)
    return out.getvalue()


def edit_json(page_text):
    """The decoded JSON the edit form offers (the body textarea's content)."""
    start = page_text.index('name="body"')
    start = page_text.index(">", start) + 1
    end = page_text.index("</textarea>", start)
    return json.loads(html.unescape(page_text[start:end]))


def test_protobuf_bodies_from_an_uploaded_descriptor_set(
    collector, amqp, client, admin_user, operator, proto
):
    descriptor_set, classes = proto
    client.force_login(admin_user)
    created = client.post(
        "/decoders/",
        {
            "name": "orders protobuf",
            "position": 10,
            "queue_pattern": "app.proto*",
            "decoder": "protobuf",
            "descriptor_file": SimpleUploadedFile("orders.desc", descriptor_set),
        },
    )
    assert created.status_code == 302, created.content.decode()[:2000]
    assert Activity.objects.filter(action="decoder_rule_created").count() == 1
    order = classes["OrderCreated"](order_id="ord-pb-77", amount=12.5, skus=["A-1", "B-2"])
    order.customer.name = "Ana Lytic"
    message = dead_letter(
        amqp,
        "app.protobuf",
        zstandard.compress(order.SerializeToString()),
        "pb-1",
        content_encoding="zstd",
        content_type="application/x-protobuf",
        type="orders.v1.OrderCreated",
    )

    client.force_login(operator)
    page = client.get(f"/messages/{message.pk}/").content.decode()
    assert 'id="body-chain">zstd → protobuf orders.v1.OrderCreated<' in page
    assert "ord-pb-77" in page and "Ana Lytic" in page and 'id="body-hex"' in page
    assert search_index.index_new() >= 1
    assert search("ord-pb-77") == ["pb-1"]

    edit = client.get(f"/messages/{message.pk}/edit").content.decode()
    assert 'id="edit-chain">decoded: zstd → protobuf orders.v1.OrderCreated<' in edit
    value = edit_json(edit)
    assert value["order_id"] == "ord-pb-77"
    wrong = client.post(
        f"/messages/{message.pk}/edit",
        {"headers": "{}", "body": json.dumps({**value, "order_id": 5}), "queue": "app.proto.fixed"},
    )
    assert wrong.status_code == 200 and "order_id" in wrong.content.decode()
    assert 'id="body-error"' in wrong.content.decode()

    amqp.queue_declare("app.proto.fixed", durable=True)
    done = client.post(
        f"/messages/{message.pk}/edit",
        {"headers": "{}", "body": json.dumps({**value, "amount": 99}), "queue": "app.proto.fixed"},
    )
    assert done.status_code == 302
    props, body = consume(amqp, "app.proto.fixed")
    back = classes["OrderCreated"].FromString(zstandard.decompress(body))
    assert (back.order_id, back.amount, list(back.skus)) == ("ord-pb-77", 99, ["A-1", "B-2"])
    assert props.content_encoding == "zstd" and props.type == "orders.v1.OrderCreated"
    assert Message.objects.get(pk=message.pk).body_bytes == zstandard.compress(
        order.SerializeToString()
    )  # the stored original is unchanged


def test_a_protobuf_of_the_wrong_type_says_so_beside_the_raw_bytes(
    collector, amqp, client, viewer, proto
):
    descriptor_set, classes = proto
    DecoderRule.objects.create(
        name="orders",
        queue_pattern="app.wrongtype",
        decoder="protobuf",
        descriptor_set=descriptor_set,
        protobuf_type="orders.v1.OrderCreated",
    )
    refund = classes["Refund"](refund_cents=500, partial=True)
    message = dead_letter(amqp, "app.wrongtype", refund.SerializeToString(), "pb-wrong")
    client.force_login(viewer)
    page = client.get(f"/messages/{message.pk}/").content.decode()
    assert 'id="body-decode-error"' in page
    assert "fields [7, 8] are not in orders.v1.OrderCreated" in page and 'id="body-hex"' in page


def test_avro_from_an_uploaded_schema_and_from_a_registry(
    collector, amqp, client, operator, api, registry
):
    DecoderRule.objects.create(
        name="payments",
        queue_pattern="app.avro.plain",
        decoder="avro",
        avro_schema=json.dumps(AVRO_SCHEMA),
        content_encoding="gzip",
    )
    DecoderRule.objects.create(
        name="payments via registry",
        queue_pattern="app.avro.reg",
        decoder="avro_registry",
        registry_url=registry.url,
    )
    payment = {"payment_id": "pay-31", "cents": 1999, "currency": "EUR", "note": "first"}
    plain = dead_letter(amqp, "app.avro.plain", gzip.compress(avro_bytes(payment)), "avro-1")
    framed = b"\x00" + struct.pack(">I", 7) + avro_bytes({**payment, "payment_id": "pay-32"})
    reg = dead_letter(amqp, "app.avro.reg", framed, "avro-2")
    unknown = dead_letter(amqp, "app.avro.reg", b"\x00" + struct.pack(">I", 99) + b"\x02", "avro-3")

    client.force_login(operator)
    page = client.get(f"/messages/{plain.pk}/").content.decode()
    assert 'id="body-chain">gzip → avro payments.v2.Payment<' in page and "pay-31" in page
    body = api.as_user(operator).get(f"/api/v1/messages/{reg.pk}/body", decoded="true").json()
    assert body["value"] == {**payment, "payment_id": "pay-32"}
    assert body["label"] == "avro payments.v2.Payment (registry id 7)"
    page = client.get(f"/messages/{unknown.pk}/").content.decode()
    assert "schema id 99 unknown (404)" in page and 'id="body-hex"' in page
    assert search_index.index_new() >= 3
    assert search("pay-31") == ["avro-1"] and search("pay-32") == ["avro-2"]

    value = edit_json(client.get(f"/messages/{reg.pk}/edit").content.decode())
    refused = client.post(
        f"/messages/{reg.pk}/edit",
        {
            "headers": "{}",
            "body": json.dumps({**value, "currency": "GBP"}),
            "queue": "app.avro.fixed",
        },
    )
    assert refused.status_code == 200 and "currency" in refused.content.decode()
    amqp.queue_declare("app.avro.fixed", durable=True)
    client.post(
        f"/messages/{reg.pk}/edit",
        {"headers": "{}", "body": json.dumps({**value, "cents": 2500}), "queue": "app.avro.fixed"},
    )
    _props, sent = consume(amqp, "app.avro.fixed")
    assert sent[:5] == b"\x00" + struct.pack(">I", 7)
    got = fastavro.schemaless_reader(io.BytesIO(sent[5:]), fastavro.parse_schema(AVRO_SCHEMA), None)
    assert got == {**payment, "payment_id": "pay-32", "cents": 2500}


def test_a_registry_that_is_down_or_silent_leaves_the_raw_view_with_the_reason(
    collector, amqp, client, viewer, settings
):
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        down_url = f"http://127.0.0.1:{closed.getsockname()[1]}"
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # accepts connections, never answers
    settings.SCHEMA_REGISTRY_TIMEOUT = 0.5
    DecoderRule.objects.create(
        name="down", queue_pattern="app.reg.down", decoder="avro_registry", registry_url=down_url
    )
    DecoderRule.objects.create(
        name="silent",
        queue_pattern="app.reg.silent",
        decoder="avro_registry",
        registry_url=f"http://127.0.0.1:{silent.getsockname()[1]}",
    )
    framed = b"\x00" + struct.pack(">I", 7) + b"\x02"
    down = dead_letter(amqp, "app.reg.down", framed, "reg-down")
    quiet = dead_letter(amqp, "app.reg.silent", framed, "reg-silent")
    client.force_login(viewer)
    page = client.get(f"/messages/{down.pk}/").content.decode()
    assert "unreachable" in page and 'id="body-hex"' in page
    started = time.monotonic()
    page = client.get(f"/messages/{quiet.pk}/").content.decode()
    assert time.monotonic() - started < 5
    assert "timed out" in page and 'id="body-hex"' in page
    silent.close()


def test_a_bad_rule_is_a_form_error_and_nothing_is_saved(client, admin_user, proto):
    descriptor_set, _classes = proto
    client.force_login(admin_user)
    cases = [
        (
            {
                "decoder": "protobuf",
                "descriptor_file": SimpleUploadedFile("x.desc", b"\xff\xfegarbage"),
            },
            "descriptor_file",
        ),
        (
            {
                "decoder": "protobuf",
                "descriptor_file": SimpleUploadedFile("o.desc", descriptor_set),
                "protobuf_type": "orders.v1.Nope",
            },
            "descriptor_file",
        ),
        ({"decoder": "protobuf"}, "descriptor_file"),
        ({"decoder": "avro", "avro_schema": '{"type": "record", "name": "X"'}, "avro_schema"),
        ({"decoder": "avro", "avro_schema": '{"type": "nonsense"}'}, "avro_schema"),
        ({"decoder": "json", "content_encoding": "br"}, "content_encoding"),
        ({"decoder": "json", "queue_pattern": ""}, "queue_pattern"),
    ]
    for data, field in cases:
        response = client.post(
            "/decoders/", {"name": f"bad {field}", "position": 1, "queue_pattern": "q.*", **data}
        )
        assert response.status_code == 400, (data, response.status_code)
        assert f'id="error-{field}"' in response.content.decode(), (data, field)
    assert not DecoderRule.objects.exists()
