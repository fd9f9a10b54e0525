"""Readable bodies in Chromium, one test per kind the issue names: a gzip JSON, a zstd protobuf
(its .proto compiled by protoc in the test, tests/bodies/conftest.py), an Avro record from an
uploaded schema and a MessagePack map. Each is dead-lettered for real, collected, found by an id
inside it, shown decoded with its chain and the raw bytes one click away, edited as JSON (a value
that does not fit is refused, naming the field, where the format has a schema), replayed, and
consumed back, decoded by the format's own library, as the edited value."""

import gzip
import io
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import fastavro
import msgpack
import pytest
import zstandard
from playwright.sync_api import expect

from recovery.models import DecoderRule, Message
from recovery.search import index as search_index
from tests.helpers import declare_app_queue, publish, wait_for
from tests.helpers.bodies import AVRO_SCHEMA, compile_orders_proto

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

AVRO = fastavro.parse_schema(AVRO_SCHEMA)


def avro_bytes(value):
    out = io.BytesIO()
    fastavro.schemaless_writer(out, AVRO, value)
    return out.getvalue()


@dataclass
class Kind:
    body: bytes
    properties: dict
    chain: str
    shown: str  # a line of the pretty JSON the detail page shows
    search_for: str
    edit: dict  # fields the operator changes
    refused: dict | None  # a change the schema refuses (None: the format has no schema)
    read_back: Callable[[bytes], Any]
    expected: Any


def protobuf_kind(tmp_path):
    descriptor_set, classes = compile_orders_proto(tmp_path)
    DecoderRule.objects.create(
        name="orders", queue_pattern="app.kind.*", decoder="protobuf", descriptor_set=descriptor_set
    )
    order = classes["OrderCreated"](order_id="ord-browser-42", amount=7.25, skus=["X-9"])

    def read_back(sent):
        back = classes["OrderCreated"].FromString(zstandard.decompress(sent))
        return back.order_id, back.amount, list(back.skus)

    return Kind(
        body=zstandard.compress(order.SerializeToString()),
        properties={"content_encoding": "zstd", "type": "orders.v1.OrderCreated"},
        chain="zstd → protobuf orders.v1.OrderCreated",
        shown='"order_id": "ord-browser-42"',
        search_for="ord-browser-42",
        edit={"amount": 8.5},
        refused={"amount": "not a number"},
        read_back=read_back,
        expected=("ord-browser-42", 8.5, ["X-9"]),
    )


def avro_kind(tmp_path):
    DecoderRule.objects.create(
        name="payments",
        queue_pattern="app.kind.*",
        decoder="avro",
        avro_schema=json.dumps(AVRO_SCHEMA),
    )
    payment = {"payment_id": "pay-browser-7", "cents": 1999, "currency": "EUR", "note": None}
    return Kind(
        body=avro_bytes(payment),
        properties={},
        chain="avro payments.v2.Payment",
        shown='"payment_id": "pay-browser-7"',
        search_for="pay-browser-7",
        edit={"cents": 2500},
        refused={"currency": "GBP"},  # not a symbol of the enum
        read_back=lambda sent: fastavro.schemaless_reader(io.BytesIO(sent), AVRO, None),
        expected={**payment, "cents": 2500},
    )


def gzip_json_kind(tmp_path):
    order = {"order_id": "ord-gzip-browser", "amount": 3.5}
    return Kind(
        body=gzip.compress(json.dumps(order).encode()),
        properties={"content_encoding": "gzip", "content_type": "application/json"},
        chain="gzip → json",
        shown='"order_id": "ord-gzip-browser"',
        search_for="ord-gzip-browser",
        edit={"amount": 4.0},
        refused=None,
        read_back=lambda sent: json.loads(gzip.decompress(sent)),
        expected={**order, "amount": 4.0},
    )


def msgpack_kind(tmp_path):
    order = {"order_id": "ord-mp-browser", "qty": 2, "tags": ["a", "b"]}
    return Kind(
        body=msgpack.packb(order),
        properties={"content_type": "application/msgpack"},
        chain="msgpack",
        shown='"order_id": "ord-mp-browser"',
        search_for="ord-mp-browser",
        edit={"qty": 3},
        refused=None,
        read_back=msgpack.unpackb,
        expected={**order, "qty": 3},
    )


@pytest.mark.parametrize(
    "make_kind",
    [protobuf_kind, avro_kind, gzip_json_kind, msgpack_kind],
    ids=["zstd-protobuf", "avro", "gzip-json", "msgpack"],
)
def test_an_operator_reads_finds_edits_and_replays_each_kind(
    make_kind, tab, operator, collector, amqp, tmp_path
):
    kind = make_kind(tmp_path)
    declare_app_queue(amqp, "app.kind.browser")
    message_id = f"browser-{make_kind.__name__}"
    publish(amqp, "app.kind.browser", kind.body, message_id=message_id, **kind.properties)
    method = wait_for(lambda: amqp.basic_get("app.kind.browser")[0], message="the delivery")
    amqp.basic_reject(method.delivery_tag, requeue=False)
    message = wait_for(
        lambda: Message.objects.filter(message_id=message_id).first(), message="stored"
    )
    assert bytes(message.body_bytes) == kind.body  # stored as sent
    search_index.index_new()

    tab.login("otto")
    tab.goto("/messages/")
    tab.page.fill('input[name="q"]', kind.search_for)
    tab.page.press('input[name="q"]', "Enter")
    rows = tab.page.locator("#message-table tbody tr")
    expect(rows).to_have_count(1)
    rows.first.locator("a").first.click()
    expect(tab.page.locator("#body-chain")).to_have_text(kind.chain)
    expect(tab.page.locator("#body-decoded")).to_contain_text(kind.shown)
    tab.page.locator("summary", has_text="Hex").click()
    expect(tab.page.locator("#body-hex")).to_be_visible()  # the raw bytes, one click away
    tab.screenshot("decoded")

    tab.goto(f"/messages/{message.pk}/edit")
    expect(tab.page.locator("#edit-chain")).to_contain_text(kind.chain.split(" → ")[-1])
    value = json.loads(tab.page.locator('textarea[name="body"]').input_value())
    amqp.queue_declare("app.kind.fixed", durable=True)
    tab.page.fill('input[name="queue"]', "app.kind.fixed")
    if kind.refused is not None:
        tab.page.fill('textarea[name="body"]', json.dumps({**value, **kind.refused}))
        tab.page.click("#edit-replay-button")
        expect(tab.page.locator("#body-error")).to_contain_text(next(iter(kind.refused)))
        tab.screenshot("refused")
    tab.page.fill('textarea[name="body"]', json.dumps({**value, **kind.edit}))
    tab.page.click("#edit-replay-button")
    expect(tab.page).to_have_url(f"{tab.base_url}/messages/{message.pk}/")

    def consumed():
        method, _props, body = amqp.basic_get("app.kind.fixed", auto_ack=True)
        return body if method else None

    assert kind.read_back(wait_for(consumed)) == kind.expected
    assert tab.errors == [], tab.errors
