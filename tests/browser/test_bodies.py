"""Readable bodies in Chromium: a zstd-compressed protobuf dead-lettered for real, shown decoded
with its chain, found by an order id inside it, edited as JSON, replayed, and consumed back as
the edited value (the protobuf classes come from protoc, tests/bodies/conftest.py)."""

import json

import pytest
import zstandard
from playwright.sync_api import expect

from recovery.models import DecoderRule, Message
from recovery.search import index as search_index
from tests.bodies.conftest import compile_orders_proto
from tests.helpers import declare_app_queue, publish, wait_for

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_an_operator_reads_finds_edits_and_replays_a_protobuf_body(
    tab, operator, collector, amqp, tmp_path
):
    descriptor_set, classes = compile_orders_proto(tmp_path)
    DecoderRule.objects.create(
        name="orders", queue_pattern="app.pb.*", decoder="protobuf", descriptor_set=descriptor_set
    )
    order = classes["OrderCreated"](order_id="ord-browser-42", amount=7.25, skus=["X-9"])
    declare_app_queue(amqp, "app.pb.browser")
    publish(
        amqp,
        "app.pb.browser",
        zstandard.compress(order.SerializeToString()),
        message_id="pb-browser",
        content_encoding="zstd",
        type="orders.v1.OrderCreated",
    )
    method = wait_for(lambda: amqp.basic_get("app.pb.browser")[0], message="the delivery")
    amqp.basic_reject(method.delivery_tag, requeue=False)
    message = wait_for(
        lambda: Message.objects.filter(message_id="pb-browser").first(), message="stored"
    )
    search_index.index_new()

    tab.login("otto")
    tab.goto("/messages/")
    tab.page.fill('input[name="q"]', "ord-browser-42")
    tab.page.press('input[name="q"]', "Enter")
    rows = tab.page.locator("#message-table tbody tr")
    expect(rows).to_have_count(1)
    rows.first.locator("a").first.click()
    expect(tab.page.locator("#body-chain")).to_have_text("zstd → protobuf orders.v1.OrderCreated")
    expect(tab.page.locator("#body-decoded")).to_contain_text('"order_id": "ord-browser-42"')
    tab.page.locator("summary", has_text="Hex").click()
    expect(tab.page.locator("#body-hex")).to_be_visible()  # the raw bytes, one click away
    tab.screenshot("decoded")

    tab.goto(f"/messages/{message.pk}/edit")
    expect(tab.page.locator("#edit-chain")).to_contain_text("protobuf orders.v1.OrderCreated")
    value = json.loads(tab.page.locator('textarea[name="body"]').input_value())
    tab.page.fill('textarea[name="body"]', json.dumps({**value, "amount": "not a number"}))
    amqp.queue_declare("app.pb.fixed", durable=True)
    tab.page.fill('input[name="queue"]', "app.pb.fixed")
    tab.page.click("#edit-replay-button")
    expect(tab.page.locator("#body-error")).to_contain_text("amount")
    tab.screenshot("refused")
    tab.page.fill('textarea[name="body"]', json.dumps({**value, "amount": 8.5}))
    tab.page.click("#edit-replay-button")
    expect(tab.page).to_have_url(f"{tab.base_url}/messages/{message.pk}/")

    def consumed():
        method, _props, body = amqp.basic_get("app.pb.fixed", auto_ack=True)
        return body if method else None

    back = classes["OrderCreated"].FromString(zstandard.decompress(wait_for(consumed)))
    assert (back.order_id, back.amount, list(back.skus)) == ("ord-browser-42", 8.5, ["X-9"])
    assert tab.errors == [], tab.errors
