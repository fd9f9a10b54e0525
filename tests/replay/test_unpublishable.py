"""Messages that cannot go on the wire are failed with their reason, never retried (#20).

Headers nested deeper than the collector would store, or larger than a frame: a one-click replay
records a failed attempt with the reason (not a 500, not "broker unavailable"), a bulk job fails
that item and goes on, and the API and the console's edit form refuse such headers up front.
"""

import pika
import pytest

from recovery.broker.codec import decode_table, json_headers_problem, unpublishable
from recovery.client.headers import MAX_HEADER_DEPTH, UndecodableHeaders, nesting_depth
from recovery.models import Message, ReplayAttempt, ReplayJobItem, Status
from recovery.replay import replay_message
from recovery.replay.jobs import create_job
from tests.helpers import declare_app_queue, make_user
from tests.helpers.api import make_message
from tests.helpers.replay import consume_until_idle, dead_letters, run

pytestmark = pytest.mark.django_db(transaction=True)


def nested(levels):
    """A headers table whose tables nest ``levels`` deep (the headers table itself is 1)."""
    value = {"leaf": True}
    for _ in range(levels - 2):
        value = {"n": value}
    return {"deep": value}


def encoded(table):
    pieces = []
    pika.data.encode_table(pieces, table)
    return b"".join(pieces)


# ---- the one limit, in and out (pure logic) ------------------------------------------------


def test_the_collectors_limit_and_the_encoders_limit_are_one_number():
    at_limit, beyond = nested(MAX_HEADER_DEPTH), nested(MAX_HEADER_DEPTH + 1)
    assert nesting_depth(at_limit) == MAX_HEADER_DEPTH
    decoded, _ = decode_table(encoded(at_limit), 0)
    assert decoded == at_limit and not isinstance(decoded, UndecodableHeaders)
    assert unpublishable(pika.BasicProperties(headers=decoded)) is None

    kept, _ = decode_table(encoded(beyond), 0)
    assert isinstance(kept, UndecodableHeaders)  # the collector quarantines it
    reason = unpublishable(pika.BasicProperties(headers=beyond))
    assert reason == f"headers nested {MAX_HEADER_DEPTH + 1} levels deep; at most 64 can be sent"


def test_arrays_count_as_levels_too():
    value = {"leaf": 1}
    for _ in range(MAX_HEADER_DEPTH):
        value = [value]
    kept, _ = decode_table(encoded({"a": value}), 0)
    assert isinstance(kept, UndecodableHeaders)


def test_headers_larger_than_a_frame_are_refused_with_the_frame_size():
    reason = unpublishable(pika.BasicProperties(headers={"big": "x" * 200_000}))
    assert "131072 bytes" in reason and "one frame" in reason
    assert unpublishable(pika.BasicProperties(headers={"small": "x" * 100_000})) is None


@pytest.mark.parametrize(
    ("headers", "said"),
    [
        (nested(3000), "nested too deep"),
        ({"ts": {"$t": "timestamp", "v": 10**400}}, "cannot be encoded"),
        ({"d": {"$t": "decimal", "v": "NaN"}}, "cannot be encoded"),
        ({"i": 10**30}, "cannot be encoded"),
        ({"big": "x" * 200_000}, "one frame"),
    ],
)
def test_edits_that_cannot_be_sent_are_named(headers, said):
    problem = json_headers_problem(headers)
    assert problem is not None and said in problem


# ---- real broker and database ---------------------------------------------------------------


def test_one_click_replay_of_a_message_too_deep_fails_with_the_reason(wired, amqp):
    operator = make_user("deep-op", "operator")
    declare_app_queue(amqp, "deep.q")
    [message] = dead_letters("deep.q", 1, headers=nested(300))

    attempt = replay_message(message, user=operator)

    assert attempt.outcome == ReplayAttempt.Outcome.FAILED
    assert attempt.detail.startswith("headers nested 300 levels deep")
    message.refresh_from_db()
    assert message.status == Status.PENDING and "nested 300" in message.status_reason
    assert consume_until_idle("deep.q") == []


def test_the_api_answers_a_failed_attempt_and_keeps_the_idempotency_key(wired, amqp, client):
    operator = make_user("big-op", "operator")
    client.force_login(operator)
    declare_app_queue(amqp, "big.q")
    message = make_message(source_queue="big.q", headers={"big": "x" * 200_000})
    url, key = f"/api/v1/messages/{message.pk}/replay", {"HTTP_IDEMPOTENCY_KEY": "big-1"}

    first = client.post(url, {}, content_type="application/json", **key)
    again = client.post(url, {}, content_type="application/json", **key)

    assert first.status_code == 200, first.content
    assert first.json()["outcome"] == "failed" and "one frame" in first.json()["detail"]
    assert again.json() == first.json() and again["Idempotent-Replayed"] == "true"
    assert ReplayAttempt.objects.filter(message=message).count() == 1
    assert consume_until_idle("big.q") == []


def test_an_empty_idempotency_key_is_a_400(wired, client):
    client.force_login(make_user("empty-key", "operator"))
    message = make_message()
    response = client.post(
        f"/api/v1/messages/{message.pk}/replay",
        {},
        content_type="application/json",
        HTTP_IDEMPOTENCY_KEY="",
    )
    assert response.status_code == 400
    assert response["Content-Type"] == "application/problem+json"


def test_a_job_fails_what_cannot_be_sent_and_finishes_the_rest(wired, amqp):
    operator = make_user("job-op", "operator")
    declare_app_queue(amqp, "mixed.q")
    fine = dead_letters("mixed.q", 20)
    [too_deep] = dead_letters("mixed.q", 1, headers=nested(300))
    [too_big] = dead_letters("mixed.q", 1, headers={"big": "x" * 200_000})

    job = create_job(operator, filters={"queue": "mixed.q"})
    assert run(job) == "done"

    assert (job.confirmed, job.failed) == (20, 2)
    failed = dict(
        ReplayJobItem.objects.filter(job=job, state="failed").values_list("message_id", "detail")
    )
    assert failed[too_deep.pk].startswith("headers nested 300 levels deep")
    assert "one frame" in failed[too_big.pk]
    assert sorted(p.message_id for p, _b in consume_until_idle("mixed.q")) == sorted(
        m.message_id for m in fine
    )
    assert Message.objects.get(pk=too_deep.pk).status == Status.PENDING
