"""Idempotency-Key on POSTs that send messages, against the real broker: a retry sends nothing."""

import datetime

from django.utils import timezone

from recovery.models import IdempotencyKey, Message, ReplayAttempt
from tests.helpers import drain, make_user
from tests.helpers.api import make_message


def test_replaying_twice_with_one_key_sends_one_message(operator_api, amqp, app_queue):
    message = make_message(source_queue=app_queue)
    url, key = f"/api/v1/messages/{message.pk}/replay", {"Idempotency-Key": "retry-1"}
    first = operator_api.post(url, {}, headers=key)
    second = operator_api.post(url, {}, headers=key)
    assert first.status_code == second.status_code == 200
    assert second.json() == first.json()
    assert second["Idempotent-Replayed"] == "true" and not first.has_header("Idempotent-Replayed")
    assert len(drain(amqp, app_queue)) == 1
    assert ReplayAttempt.objects.count() == 1
    assert Message.objects.get(pk=message.pk).replay_count == 1


def test_without_a_key_each_post_replays_again(operator_api, amqp, app_queue):
    message = make_message(source_queue=app_queue)
    for _ in range(2):
        assert operator_api.post(f"/api/v1/messages/{message.pk}/replay").status_code == 200
    assert len(drain(amqp, app_queue)) == 2


def test_one_key_on_a_different_request_is_422_and_sends_nothing(operator_api, amqp, app_queue):
    first, other = make_message(source_queue=app_queue), make_message(source_queue=app_queue)
    key = {"Idempotency-Key": "k-422"}
    assert operator_api.post(f"/api/v1/messages/{first.pk}/replay", {}, key).status_code == 200
    drain(amqp, app_queue)
    for url, body in [
        (f"/api/v1/messages/{other.pk}/replay", {}),
        (f"/api/v1/messages/{first.pk}/replay", {"queue": app_queue}),
    ]:
        response = operator_api.post(url, body, headers=key)
        assert response.status_code == 422, response.content
        assert response.json()["code"] == "idempotency_key_reused"
    assert drain(amqp, app_queue) == []
    assert Message.objects.get(pk=other.pk).status == "pending"


def test_keys_are_per_user(api_as, db, amqp, app_queue):
    message = make_message(source_queue=app_queue)
    url, key = f"/api/v1/messages/{message.pk}/replay", {"Idempotency-Key": "shared-name"}
    assert api_as(make_user("o1", "operator")).post(url, {}, key).status_code == 200
    second = api_as(make_user("o2", "operator")).post(url, {}, key)
    assert second.status_code == 200 and not second.has_header("Idempotent-Replayed")
    assert len(drain(amqp, app_queue)) == 2


def test_a_request_still_in_progress_is_409(operator_api, amqp, app_queue):
    from recovery.api.idempotency import request_fingerprint

    message = make_message(source_queue=app_queue)
    url = f"/api/v1/messages/{message.pk}/replay"

    class Twin:  # the request the other process is running
        method, path, data = "POST", url, {}

    IdempotencyKey.objects.create(
        user=operator_api.user,
        key="busy",
        request_hash=request_fingerprint(Twin),
        method="POST",
        path=url,
        expires_at=timezone.now() + datetime.timedelta(hours=1),
    )
    response = operator_api.post(url, {}, headers={"Idempotency-Key": "busy"})
    assert response.status_code == 409
    assert response.json()["code"] == "idempotency_key_in_progress"
    assert drain(amqp, app_queue) == []


def test_an_answer_that_sent_nothing_releases_the_key(operator_api, amqp, app_queue):
    message = make_message(source_queue=app_queue, status="replaying")
    url, key = f"/api/v1/messages/{message.pk}/replay", {"Idempotency-Key": "after-409"}
    assert operator_api.post(url, {}, headers=key).status_code == 409
    Message.objects.filter(pk=message.pk).update(status="pending")
    retry = operator_api.post(url, {}, headers=key)
    assert retry.status_code == 200 and not retry.has_header("Idempotent-Replayed")
    assert len(drain(amqp, app_queue)) == 1


def test_a_broker_outage_releases_the_key_and_the_retry_sends_once(
    operator_api, amqp, app_queue, settings
):
    from tests.faults import TcpProxy

    message = make_message(source_queue=app_queue)
    url, key = f"/api/v1/messages/{message.pk}/replay", {"Idempotency-Key": "outage"}
    real_url = settings.RABBITMQ_URL
    with TcpProxy(5672) as proxy:
        proxy.refusing = True
        settings.RABBITMQ_URL = real_url.replace(":5672", f":{proxy.port}")
        assert operator_api.post(url, {}, headers=key).status_code == 503
    settings.RABBITMQ_URL = real_url
    assert operator_api.post(url, {}, headers=key).status_code == 200
    assert operator_api.post(url, {}, headers=key)["Idempotent-Replayed"] == "true"
    assert len(drain(amqp, app_queue)) == 1


def test_a_validation_error_releases_the_key(operator_api, wired):
    message = make_message()
    url, key = f"/api/v1/messages/{message.pk}/replay", {"Idempotency-Key": "bad-body"}
    first = operator_api.post(url, {"exchange": "x"}, headers=key)
    assert first.status_code == 400
    # A 400 is raised before anything is sent: the key is free again.
    assert not IdempotencyKey.objects.filter(key="bad-body").exists()


def test_expired_keys_are_forgotten(operator_api, amqp, app_queue):
    message = make_message(source_queue=app_queue)
    url, key = f"/api/v1/messages/{message.pk}/replay", {"Idempotency-Key": "old"}
    assert operator_api.post(url, {}, headers=key).status_code == 200
    IdempotencyKey.objects.update(expires_at=timezone.now() - datetime.timedelta(seconds=1))
    again = operator_api.post(url, {}, headers=key)
    assert again.status_code == 200 and not again.has_header("Idempotent-Replayed")
    assert len(drain(amqp, app_queue)) == 2
    assert IdempotencyKey.objects.count() == 1
