"""messages: filters, cursor pages, detail, and replay with targets and edits on the real broker."""

import base64
import datetime

import pika
import pytest
from django.utils import timezone

from recovery.models import Activity, Message
from tests.helpers import drain
from tests.helpers.api import make_message


def test_filters_and_the_q_search(viewer_api):
    now = timezone.now()
    old = make_message(source_queue="a", collected_at=now - datetime.timedelta(days=2))
    new = make_message(source_queue="a", kind="unroutable", reason="no_route")
    other = make_message(source_queue="b", source_exchange="orders", message_id="order-42")

    def ids(**params):
        response = viewer_api.get("/api/v1/messages", params)
        assert response.status_code == 200, response.content
        return [row["id"] for row in response.json()["results"]]

    assert ids(queue="a") == [new.pk, old.pk]
    assert ids(kind="unroutable") == [new.pk]
    assert ids(reason="rejected", queue="a") == [old.pk]
    assert ids(exchange="orders") == [other.pk]
    assert ids(status="pending", queue="b") == [other.pk]
    assert ids(since=(now - datetime.timedelta(days=1)).isoformat(), queue="a") == [new.pk]
    assert ids(until=(now - datetime.timedelta(days=1)).isoformat()) == [old.pk]
    assert ids(q="order-42") == [other.pk]


def test_cursor_pages_walk_every_message_once(viewer_api):
    made = [make_message(source_queue="paged").pk for _ in range(7)]
    seen, url, params = [], "/api/v1/messages", {"queue": "paged", "page_size": 3}
    while url:
        page = viewer_api.get(url, params).json()
        seen += [row["id"] for row in page["results"]]
        url, params = page["next"], None
    assert seen == sorted(made, reverse=True)


def test_detail_carries_body_headers_and_properties(viewer_api):
    message = make_message(headers={"x-n": 1, "price": {"$t": "decimal", "v": "1.50"}})
    body = viewer_api.get(f"/api/v1/messages/{message.pk}").json()
    assert base64.b64decode(body["body_base64"]) == message.body_bytes
    assert body["body_text"] == message.body_bytes.decode()
    assert body["headers"]["price"] == {"$t": "decimal", "v": "1.50"}
    assert body["properties"]["content_type"] == "application/json"


def test_detail_says_transient_and_the_applications_own_retry_count(viewer_api):
    counted = make_message(headers={"x-retry-count": 3})
    transient = make_message(properties={"content_type": "text/plain"})
    body = viewer_api.get(f"/api/v1/messages/{counted.pk}").json()
    assert (body["transient"], body["app_retries"]) == (
        False,
        {"header": "x-retry-count", "count": 3},
    )
    body = viewer_api.get(f"/api/v1/messages/{transient.pk}").json()
    assert (body["transient"], body["app_retries"]) == (True, None)


def test_replay_goes_back_to_the_queue_it_died_in(operator_api, amqp, app_queue):
    message = make_message(source_queue=app_queue, headers={"x-death": [], "keep": "me"})
    response = operator_api.post(f"/api/v1/messages/{message.pk}/replay")
    assert response.status_code == 200, response.content
    assert response.json()["outcome"] == "confirmed"
    assert response.json()["message"]["status"] == "replayed"
    [(properties, body)] = drain(amqp, app_queue)
    assert body == message.body_bytes
    assert properties.headers["keep"] == "me" and "x-death" not in properties.headers
    assert properties.headers["x-recovery-replayed-by"] == "o"
    assert Activity.objects.get(action="replay").via == "api"


def test_replay_with_a_target_queue_and_edits(operator_api, amqp, app_queue):
    message = make_message(source_queue="somewhere.else", headers={"old": 1})
    response = operator_api.post(
        f"/api/v1/messages/{message.pk}/replay",
        {"queue": app_queue, "headers": {"fixed": True}, "body_text": '{"n": "fixed"}'},
    )
    assert response.status_code == 200, response.content
    assert response.json()["edited"] is True
    [(properties, body)] = drain(amqp, app_queue)
    assert body == b'{"n": "fixed"}'
    assert properties.headers["fixed"] is True and "old" not in properties.headers
    message.refresh_from_db()
    assert message.body_bytes != body  # the stored original is kept


def test_replay_to_nowhere_is_returned_and_stays_pending(operator_api, wired):
    message = make_message(source_queue="no.such.queue.anywhere")
    response = operator_api.post(f"/api/v1/messages/{message.pk}/replay")
    assert response.status_code == 200
    assert response.json()["outcome"] == "returned"
    message.refresh_from_db()
    assert message.status == "pending" and "NO_ROUTE" in message.status_reason


def test_replay_of_a_message_being_replayed_is_409(operator_api, wired):
    message = make_message(status="replaying")
    response = operator_api.post(f"/api/v1/messages/{message.pk}/replay")
    assert response.status_code == 409 and response.json()["code"] == "conflict"
    assert Message.objects.get(pk=message.pk).status == "replaying"


def test_replay_body_must_be_one_of_text_or_base64(operator_api, wired):
    message = make_message()
    response = operator_api.post(
        f"/api/v1/messages/{message.pk}/replay", {"body_text": "a", "body_base64": "YQ=="}
    )
    assert response.status_code == 400 and "body_text" in response.json()["errors"]


def test_broker_unreachable_is_503_and_nothing_changes(operator_api, wired, settings):
    from tests.faults import TcpProxy

    message = make_message()
    with TcpProxy(5672) as proxy:
        proxy.refusing = True
        settings.RABBITMQ_URL = settings.RABBITMQ_URL.replace(":5672", f":{proxy.port}")
        response = operator_api.post(f"/api/v1/messages/{message.pk}/replay")
    assert response.status_code == 503 and response.json()["code"] == "broker_unavailable"
    message.refresh_from_db()
    assert message.status == "pending" and message.replay_count == 0


def test_messages_from_amqp_properties_survive_the_round_trip(operator_api, amqp, app_queue):
    message = make_message(
        source_queue=app_queue,
        properties={"message_id": "keep-id", "correlation_id": "c-1", "delivery_mode": 2},
    )
    operator_api.post(f"/api/v1/messages/{message.pk}/replay")
    [(properties, _)] = drain(amqp, app_queue)
    assert isinstance(properties, pika.BasicProperties)
    assert (properties.message_id, properties.correlation_id) == ("keep-id", "c-1")


def test_discard_then_restore(operator_api, wired):
    message = make_message(status="poisoned")
    url = f"/api/v1/messages/{message.pk}"
    discarded = operator_api.post(f"{url}/discard", {"reason": "bad payload, ticket 12"})
    assert discarded.status_code == 200, discarded.content
    assert discarded.json()["status"] == "discarded" and discarded.json()["discarded_at"]
    again = operator_api.post(f"{url}/discard")
    assert again.status_code == 409 and again.json()["code"] == "conflict"
    assert operator_api.post(f"{url}/replay").status_code == 409
    restored = operator_api.post(f"{url}/restore")
    assert restored.status_code == 200 and restored.json()["status"] == "poisoned"
    assert operator_api.post(f"{url}/restore").status_code == 409
    actions = list(Activity.objects.order_by("id").values_list("action", "via"))
    assert actions == [("discard", "api"), ("restore", "api")]
    assert Activity.objects.get(action="discard").detail["reason"] == "bad payload, ticket 12"


def test_discard_by_filter_discards_every_match_and_logs_each(operator_api, wired):
    kept = [make_message(source_queue="junk.q", status=s) for s in ("discarded", "replaying")]
    junk = [
        make_message(source_queue="junk.q", status=s)
        for s in ("pending", "pending", "pending", "poisoned", "replayed")
    ]
    other = make_message(source_queue="real.q")

    response = operator_api.post(
        "/api/v1/messages/discard", {"filters": {"queue": "junk.q"}, "reason": "load test"}
    )

    assert response.status_code == 200, response.content
    assert response.json() == {"discarded": 5, "remaining": 0}
    for before, message in zip(("pending",) * 3 + ("poisoned", "replayed"), junk, strict=True):
        message.refresh_from_db()
        assert (message.status, message.status_before_discard) == ("discarded", before)
        assert message.status_reason == "load test" and message.discarded_at is not None
    assert [Message.objects.get(pk=m.pk).status for m in kept] == ["discarded", "replaying"]
    assert Message.objects.get(pk=other.pk).status == "pending"
    logged = Activity.objects.filter(action="discard", via="api")
    assert sorted(logged.values_list("message_id", flat=True)) == [m.pk for m in junk]
    assert {a.detail["reason"] for a in logged} == {"load test"}
    restored = operator_api.post(f"/api/v1/messages/{junk[3].pk}/restore")
    assert restored.json()["status"] == "poisoned"
    again = operator_api.post("/api/v1/messages/discard", {"filters": {"queue": "junk.q"}})
    assert again.json() == {"discarded": 1, "remaining": 0}


def test_restore_by_filter_undoes_a_discard_by_filter(operator_api, wired):
    statuses = ("pending", "poisoned", "replayed")
    junk = [make_message(source_queue="oops.q", status=s) for s in statuses]
    earlier = make_message(source_queue="other.q", status="pending")
    operator_api.post(f"/api/v1/messages/{earlier.pk}/discard")
    operator_api.post("/api/v1/messages/discard", {"filters": {"queue": "oops.q"}})
    assert Message.objects.filter(status="discarded").count() == 4

    response = operator_api.post(
        "/api/v1/messages/restore", {"filters": {"queue": "oops.q", "status": "discarded"}}
    )

    assert response.status_code == 200, response.content
    assert response.json() == {"restored": 3, "remaining": 0}
    for before, message in zip(statuses, junk, strict=True):
        message.refresh_from_db()
        assert (message.status, message.status_before_discard) == (before, "")
        assert message.discarded_at is None and message.status_reason == ""
    assert Message.objects.get(pk=earlier.pk).status == "discarded"  # not in the filter
    restores = Activity.objects.filter(action="restore", via="api")
    assert sorted(a.detail["restored_status"] for a in restores) == sorted(statuses)
    again = operator_api.post("/api/v1/messages/restore", {"filters": {"queue": "oops.q"}})
    assert again.json() == {"restored": 0, "remaining": 0}


def test_discard_by_filter_takes_a_search_and_a_time_range_too(operator_api, wired):
    now = timezone.now()
    hit = make_message(body=b'{"sku": "NEEDLE-7"}', collected_at=now)
    old_hit = make_message(
        body=b'{"sku": "needle-7"}', collected_at=now - datetime.timedelta(days=3)
    )
    miss = make_message(body=b'{"sku": "other"}', collected_at=now)
    since = (now - datetime.timedelta(days=1)).isoformat()

    response = operator_api.post(
        "/api/v1/messages/discard", {"filters": {"q": "needle-7", "since": since}}
    )

    assert response.json() == {"discarded": 1, "remaining": 0}
    statuses = dict(Message.objects.values_list("pk", "status"))
    assert (statuses[hit.pk], statuses[old_hit.pk], statuses[miss.pk]) == (
        "discarded",
        "pending",
        "pending",
    )


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "filters"),
        ({"filters": {}}, "filters"),
        ({"filters": {"queue": ""}}, "filters"),
        ({"filters": {"kind": "grue"}}, "filters.kind"),
        ({"filters": {"queue": "q"}, "reason": 7}, "reason"),
    ],
)
def test_discard_by_filter_refuses_a_missing_or_bad_filter(operator_api, wired, body, field):
    message = make_message()
    response = operator_api.post("/api/v1/messages/discard", body)
    assert response.status_code == 400, response.content
    assert field in response.json()["errors"], response.json()
    assert Message.objects.get(pk=message.pk).status == "pending"
    if field != "reason":
        restore = operator_api.post("/api/v1/messages/restore", body)
        assert restore.status_code == 400 and field in restore.json()["errors"]


@pytest.mark.parametrize("action", ["discard", "restore"])
def test_discard_and_restore_by_filter_are_for_operators(viewer_api, wired, action):
    status = "discarded" if action == "restore" else "pending"
    message = make_message(source_queue="v.q", status=status)
    response = viewer_api.post(f"/api/v1/messages/{action}", {"filters": {"queue": "v.q"}})
    assert response.status_code == 403
    assert Message.objects.get(pk=message.pk).status == status


def test_a_delay_must_be_a_configured_one(operator_api, wired, settings):
    message = make_message()
    response = operator_api.post(f"/api/v1/messages/{message.pk}/replay", {"delay_seconds": 7})
    assert response.status_code == 400 and "delay_seconds" in response.json()["errors"]


def test_an_edited_replay_is_recorded_with_the_editor(operator_api, amqp, app_queue):
    from recovery.models import MessageEdit

    message = make_message(source_queue=app_queue)
    response = operator_api.post(
        f"/api/v1/messages/{message.pk}/replay",
        {"body_base64": base64.b64encode(b"\x00\x01").decode()},
    )
    assert response.status_code == 200, response.content
    [(_, body)] = drain(amqp, app_queue)
    assert body == b"\x00\x01"
    edit = MessageEdit.objects.get(message=message)
    assert bytes(edit.body) == b"\x00\x01" and edit.user.username == "o" and edit.via == "api"
