"""Masking changes what is shown, never what is stored or sent (#32): a masked message replayed
from the console arrives with its original headers and body."""

import json

import pytest

from recovery.models import MaskRule
from tests.helpers import declare_app_queue
from tests.helpers.replay import consume_until_idle, dead_letters

pytestmark = pytest.mark.django_db(transaction=True)

CARD = "4242424242424242"


def test_a_masked_message_is_replayed_as_stored(wired, amqp, operator, client):
    MaskRule.objects.create(kind="json_path", pattern="$.card")
    MaskRule.objects.create(kind="header", pattern="x-card")
    MaskRule.objects.create(kind="regex", pattern=r"\d{16}")
    declare_app_queue(amqp, "mask.orders")
    body = json.dumps({"card": CARD, "n": 1}).encode()
    [message] = dead_letters("mask.orders", 1, body=body, headers={"x-card": CARD})
    client.force_login(operator)
    assert CARD not in client.get(f"/messages/{message.pk}/").content.decode()
    client.post(f"/messages/{message.pk}/replay")
    [(props, sent)] = consume_until_idle("mask.orders")
    assert sent == body and props.headers["x-card"] == CARD
    message.refresh_from_db()
    assert message.body_bytes == body and message.headers["x-card"] == CARD
