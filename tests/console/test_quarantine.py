"""The quarantine page: a real collector with a 64 KiB body limit quarantines a big message; the
console shows it without taking it, an operator retries it once the limit is raised (stored,
gone from quarantine) and discards another, each in the activity log; a viewer only looks."""

import pytest

from recovery.broker import quarantine
from recovery.collector.consumer import start_collectors, stop_collectors
from recovery.models import Activity, Message
from tests.helpers.collector import depth, fill_quarantine, stored

pytestmark = pytest.mark.django_db(transaction=True)

LIMIT = 64 * 1024


@pytest.fixture
def quarantined_two(transactional_db, wired, clean_queues, amqp):
    """Two messages over a 64 KiB limit in quarantine."""
    fill_quarantine(amqp, {"huge-a": b"A" * (LIMIT + 1), "huge-b": b"B" * (LIMIT + 2)}, LIMIT)
    return wired


def test_it_shows_quarantined_messages_without_taking_them(quarantined_two, client, viewer, amqp):
    client.force_login(viewer)
    for _ in range(2):  # looking twice: still there, in the same order
        page = client.get("/quarantine/").content.decode()
        assert page.index("huge-a") < page.index("huge-b")
        assert f"body {LIMIT + 1} B &gt; limit {LIMIT} B (COLLECTOR_MAX_BODY_BYTES)" in page
        assert "recovery.dead_letters" in page and "acme" in page
        assert depth(amqp, "recovery.quarantine") == 2
    assert "Retry</button>" not in page  # a viewer looks, an operator acts
    (item_a, _item_b), _depth = quarantine.browse(quarantined_two)
    response = client.post(
        "/quarantine/act", {"vhost": quarantined_two, "key": item_a.key, "action": "discard"}
    )
    assert response.status_code == 403 and depth(amqp, "recovery.quarantine") == 2


def test_an_operator_retries_one_after_raising_the_limit_and_discards_the_other(
    quarantined_two, client, operator, amqp
):
    items, count = quarantine.browse(quarantined_two)
    assert count == 2 and [i.properties["message_id"] for i in items] == ["huge-a", "huge-b"]
    a, b = items
    client.force_login(operator)
    stop_event, threads = start_collectors(flush_seconds=0.05, max_body_bytes=LIMIT * 4)
    try:
        done = client.post(
            "/quarantine/act",
            {"vhost": quarantined_two, "key": a.key, "action": "retry"},
            follow=True,
        )
        assert f"Quarantined message {a.key} sent back to recovery.dead_letters" in (
            done.content.decode()
        )
        [row] = stored(message_id="huge-a")
    finally:
        stop_collectors(stop_event, threads)
    assert row.body_bytes == b"A" * (LIMIT + 1) and row.headers["tenant"] == "acme"
    assert not any(k.startswith("x-quarantine") for k in row.headers)

    client.post("/quarantine/act", {"vhost": quarantined_two, "key": b.key, "action": "discard"})
    assert depth(amqp, "recovery.quarantine") == 0
    assert not Message.objects.filter(message_id="huge-b").exists()
    assert list(Activity.objects.order_by("id").values_list("action", "detail__message_id")) == [
        ("quarantine_retry", "huge-a"),
        ("quarantine_discard", "huge-b"),
    ]
    again = client.post(
        "/quarantine/act",
        {"vhost": quarantined_two, "key": b.key, "action": "discard"},
        follow=True,
    )
    assert "Nothing done: message" in again.content.decode()  # taken already: said, not a 500
    missing = client.post(
        "/quarantine/act", {"vhost": "no-such-vhost", "key": b.key, "action": "discard"}
    )
    assert missing.status_code == 404


def test_a_quarantine_that_cannot_be_read_is_unknown_not_empty(client, viewer, settings):
    settings.RECOVERY_VHOSTS = ["lazarus-no-such-vhost"]
    client.force_login(viewer)
    page = client.get("/quarantine/").content.decode()
    assert "Cannot read this vhost" in page and "Unknown, not empty" in page
    assert "Empty: every message" not in page
