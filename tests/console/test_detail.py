"""The message page: every stored detail, shown escaped, and the body in every useful form."""

import datetime
import decimal
import json

import pytest

from console.views.message import body_views
from recovery.client import headers as header_codec
from tests.helpers import make_message

pytestmark = pytest.mark.django_db

XSS = b'<script>alert("body")</script><img src=x onerror=alert(1)>'


def test_it_shows_json_pretty_text_and_hex():
    views = body_views(b'{"b": [1, 2], "a": "\xc3\xa9"}')
    assert views["json"] == '{\n  "b": [\n    1,\n    2\n  ],\n  "a": "é"\n}'
    assert views["text"] == '{"b": [1, 2], "a": "é"}'
    assert views["hex"].startswith("00000000  7b 22 62 22")
    assert views["default"] == "json"


def test_a_binary_body_is_hex_only():
    views = body_views(b"\x00\xff\xfe binary")
    assert views["text"] is None and views["json"] is None
    assert views["default"] == "hex"
    assert "00 ff fe" in views["hex"] and "... binary" in views["hex"]


def test_a_huge_body_is_cut_for_the_page():
    views = body_views(b"a" * (2 * 1024 * 1024))
    assert views["text_truncated"] and views["hex_truncated"]
    assert len(views["text"]) == 1024 * 1024


def test_it_shows_properties_headers_and_the_x_death_timeline(client, viewer):
    headers = header_codec.headers_to_json(
        {
            "tenant": "acme",
            "amount": decimal.Decimal("12.50"),
            "x-death": [
                {
                    "queue": "orders",
                    "reason": "expired",
                    "count": 1,
                    "exchange": "shop",
                    "routing-keys": ["orders.new"],
                    "time": datetime.datetime(2026, 1, 2, 3, 4, 6),
                },
                {
                    "queue": "orders.retry",
                    "reason": "rejected",
                    "count": 2,
                    "exchange": "",
                    "routing-keys": ["orders"],
                    "time": datetime.datetime(2026, 1, 2, 3, 4, 5),
                },
            ],
        }
    )
    message = make_message(headers=headers, properties={"app_id": "shop", "priority": 3})
    client.force_login(viewer)

    html = client.get(f"/messages/{message.pk}/").content.decode()

    assert "tenant" in html and "acme" in html
    assert "12.50" in html and ">decimal<" in html
    assert "app_id" in html and ">shop<" in html
    first = html.index("2026-01-02T03:04:05")
    second = html.index("2026-01-02T03:04:06")
    assert first < second  # oldest death first
    assert "orders.new" in html


def test_a_script_body_and_hostile_headers_are_escaped(client, viewer):
    message = make_message(
        body=XSS,
        message_id='"><script>alert("id")</script>',
        headers={"<b>name</b>": '<script>alert("header")</script>'},
        group_label="<script>alert('group')</script>",
    )
    client.force_login(viewer)

    html = client.get(f"/messages/{message.pk}/").content.decode()

    assert "<script>alert" not in html
    assert "<img src=x" not in html
    assert "&lt;script&gt;alert(&quot;body&quot;)&lt;/script&gt;" in html
    assert "&lt;b&gt;name&lt;/b&gt;" in html
    listing = client.get("/messages/").content.decode()
    assert "<script>alert" not in listing


def test_the_raw_body_downloads_and_never_renders(client, viewer):
    message = make_message(body=XSS, content_type="text/html")
    client.force_login(viewer)
    response = client.get(f"/messages/{message.pk}/body")
    assert response.content == XSS
    assert response["Content-Type"] == "application/octet-stream"
    assert response["Content-Disposition"] == f'attachment; filename="message-{message.pk}.bin"'
    assert response["X-Content-Type-Options"] == "nosniff"


def test_the_edit_form_offers_the_headers_a_replay_keeps(client, operator):
    message = make_message(
        headers={"tenant": "acme", "x-death": [{"queue": "q"}], "x-first-death-queue": "q"}
    )
    client.force_login(operator)
    response = client.get(f"/messages/{message.pk}/edit")
    assert response.status_code == 200
    shown = json.loads(response.context["form"].initial["headers"])
    assert shown == {"tenant": "acme"}


def test_an_unknown_message_is_404(client, viewer):
    client.force_login(viewer)
    assert client.get("/messages/999999/").status_code == 404


def test_a_transient_message_says_a_replay_sends_it_transient(client, operator):
    transient = make_message(properties={"content_type": "application/json"})
    persistent = make_message()  # delivery_mode 2
    client.force_login(operator)
    page = client.get(f"/messages/{transient.pk}/").content.decode()
    assert 'id="transient-warning"' in page
    assert "a replay publishes it transient too" in page
    assert (
        'id="transient-warning"' not in client.get(f"/messages/{persistent.pk}/").content.decode()
    )


def test_the_applications_own_retry_count_is_shown_beside_the_deaths(client, viewer):
    counted = make_message(death_count=1, headers={"x-retry-count": 4, "tenant": "a"})
    stringly = make_message(death_count=1, headers={"retries": "7"})
    uncounted = make_message(death_count=1, headers={"retry-count": "soon"})
    assert counted.app_retry_count == ("x-retry-count", 4)
    assert stringly.app_retry_count == ("retries", 7)
    assert uncounted.app_retry_count is None
    client.force_login(viewer)
    page = client.get(f"/messages/{counted.pk}/").content.decode()
    assert "the application's own count: 4, header <code>x-retry-count</code>" in page
    assert 'id="app-retries"' not in client.get(f"/messages/{uncounted.pk}/").content.decode()


def test_a_client_hand_over_counts_publish_attempts_and_the_timestamp_is_a_time(client, viewer):
    nacked = make_message(
        kind="nacked",
        source_queue="",
        death_count=3,
        properties={"timestamp": 1795662245, "message_id": "n-1"},
    )
    died = make_message(death_count=2)
    client.force_login(viewer)
    page = client.get(f"/messages/{nacked.pk}/").content.decode()
    assert "<dt>Publish attempts</dt>" in page and "<dt>Deaths</dt>" not in page
    assert "First / last attempt" in page
    assert "2026-11-26 03:04:05 UTC (1795662245)" in page
    page = client.get(f"/messages/{died.pk}/").content.decode()
    assert "<dt>Deaths</dt>" in page and "Publish attempts" not in page
