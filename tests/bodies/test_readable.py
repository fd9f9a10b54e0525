"""Readable bodies end to end: compressed and MessagePack bodies published to a real queue,
rejected into the DLX, collected into the store, found by a value inside, shown decoded in the
console and the API, and stored byte for byte as they came."""

import base64
import gzip
import json
import zlib

import msgpack
import pytest
import zstandard

from recovery.models import Message
from recovery.search import index as search_index
from recovery.search.filters import MessageFilterForm
from tests.helpers import declare_app_queue, publish, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

ORDER = {"order_id": "ord-5521", "customer": "Zoë Quartermaine", "amount": 42.5}

KINDS = {
    # message_id: (content_type, content_encoding, body, chain)
    "gzip-json": (
        "application/json",
        "gzip",
        gzip.compress(json.dumps({**ORDER, "order_id": "ord-gzip-1"}).encode()),
        "gzip → json",
    ),
    "zstd-msgpack": (
        "application/msgpack",
        "zstd",
        zstandard.compress(msgpack.packb({**ORDER, "order_id": "ord-zstd-2"})),
        "zstd → msgpack",
    ),
    "msgpack": (
        "application/x-msgpack",
        "",
        msgpack.packb({**ORDER, "order_id": "ord-mp-3"}),
        "msgpack",
    ),
    "b64-deflate": (
        "application/json",
        "deflate, base64",
        base64.b64encode(zlib.compress(json.dumps({**ORDER, "order_id": "ord-b64-4"}).encode())),
        "base64 → deflate → json",
    ),
}


def search(text):
    form = MessageFilterForm({"q": text})
    assert form.is_valid(), form.errors
    return sorted(form.apply().values_list("message_id", flat=True))


@pytest.fixture
def each_kind(collector, amqp):
    declare_app_queue(amqp, "app.readable")
    for message_id, (content_type, encoding, body, _chain) in KINDS.items():
        publish(
            amqp,
            "app.readable",
            body,
            message_id=message_id,
            content_type=content_type,
            content_encoding=encoding or None,
        )
    rejected = 0
    while rejected < len(KINDS):
        method, _props, _body = amqp.basic_get("app.readable")
        if method is None:
            amqp.connection.sleep(0.05)
            continue
        amqp.basic_reject(method.delivery_tag, requeue=False)
        rejected += 1
    wait_for(
        lambda: Message.objects.filter(source_queue="app.readable").count() == len(KINDS),
        message="all kinds stored",
    )
    return {m.message_id: m for m in Message.objects.filter(source_queue="app.readable")}


def test_each_kind_is_stored_as_sent_and_found_by_a_value_inside(each_kind):
    for message_id, (_ct, _enc, body, _chain) in KINDS.items():
        assert each_kind[message_id].body_bytes == body  # the stored bytes never change
    assert search_index.index_new() >= len(KINDS)
    assert search("ord-gzip-1") == ["gzip-json"]
    assert search("ord-zstd-2") == ["zstd-msgpack"]
    assert search("ord-mp-3") == ["msgpack"]
    assert search("ord-b64-4") == ["b64-deflate"]
    assert search("Quartermaine") == sorted(KINDS)


def test_the_console_shows_each_decoded_with_its_chain_and_the_raw_bytes(each_kind, client, viewer):
    client.force_login(viewer)
    for message_id, (_ct, _enc, _body, chain) in KINDS.items():
        page = client.get(f"/messages/{each_kind[message_id].pk}/").content.decode()
        assert f'id="body-chain">{chain}<' in page, message_id
        assert "Zoë Quartermaine" in page and 'id="body-hex"' in page
        assert 'id="body-decode-error"' not in page


def test_the_api_returns_raw_bytes_by_default_and_the_decoded_document_on_request(
    each_kind, api, viewer
):
    client = api.as_user(viewer)
    message = each_kind["zstd-msgpack"]
    raw = client.get(f"/api/v1/messages/{message.pk}/body")
    assert raw["Content-Type"] == "application/octet-stream"
    assert raw.content == KINDS["zstd-msgpack"][2]
    decoded = client.get(f"/api/v1/messages/{message.pk}/body", decoded="true").json()
    assert decoded["chain"] == ["zstd", "msgpack"] and decoded["label"] == "zstd → msgpack"
    assert decoded["value"] == {**ORDER, "order_id": "ord-zstd-2"} and decoded["error"] is None
    bad = client.get(f"/api/v1/messages/{message.pk}/body", decoded="maybe")
    assert bad.status_code == 400 and "decoded" in bad.content.decode()


def test_a_body_that_does_not_decode_shows_why_and_the_raw_bytes(
    collector, amqp, client, viewer, api
):
    declare_app_queue(amqp, "app.broken")
    truncated = gzip.compress(json.dumps(ORDER).encode())[:-9]
    publish(amqp, "app.broken", truncated, message_id="cut", content_encoding="gzip")
    publish(amqp, "app.broken", b"\x8b\x0b\x80", message_id="brotli", content_encoding="br")
    for _ in range(2):
        method = wait_for(lambda: amqp.basic_get("app.broken")[0], message="a delivery")
        amqp.basic_reject(method.delivery_tag, requeue=False)
    wait_for(lambda: Message.objects.filter(source_queue="app.broken").count() == 2)
    client.force_login(viewer)
    cut = Message.objects.get(message_id="cut")
    page = client.get(f"/messages/{cut.pk}/").content.decode()
    assert 'id="body-decode-error"' in page and "gzip: truncated stream" in page
    assert 'id="body-hex"' in page
    brotli = Message.objects.get(message_id="brotli")
    page = client.get(f"/messages/{brotli.pk}/").content.decode()
    assert "unknown content_encoding &#x27;br&#x27;" in page
    body = api.as_user(viewer).get(f"/api/v1/messages/{cut.pk}/body", decoded="1").json()
    assert body["error"].startswith("gzip: truncated stream") and body["value"] is None
    assert search_index.index_new() >= 2  # indexed as far as it reads, never an error
