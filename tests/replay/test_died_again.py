"""A replayed message that was dead-lettered again says so: "died again" with its new copy, in
the list, the detail, the job and the API, never a green "replayed" or "confirmed".

Real dead-lettering throughout: application queues whose consumer rejects (to recovery.dlx),
the collector running in-process, so the copy comes back exactly as it would in production.
"""

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from recovery.models import Status
from recovery.replay.jobs import create_job
from tests.helpers import declare_app_queue, make_message, publish, wait_for
from tests.helpers.collector import stored
from tests.helpers.replay import dead_letters, run

pytestmark = pytest.mark.django_db(transaction=True)


def row_of(html, pk):
    """The list row of message ``pk``."""
    href = reverse("message", args=[pk])
    # The row's first link: the message's page (with the list to come back to, ?back=...).
    link = re.compile(rf'<td[^>]*><a href="{re.escape(href)}(\?[^"]*)?"')
    [row] = [r for r in re.findall(r"<tr>.*?</tr>", html, re.S) if link.search(r)]
    return row


def by_id(api_response):
    assert api_response.status_code == 200, api_response.content
    return {m["id"]: m for m in api_response.json()["results"]}


def test_it_says_died_again_until_a_later_replay_is_confirmed(
    collector, amqp, client, api, operator, consumers
):
    declare_app_queue(amqp, "again.orders")
    consumer = consumers("again.orders", reject=True)  # the consumer is still broken
    publish(amqp, "again.orders", b'{"order": 7}', message_id="again-1")
    [original] = stored(1, message_id="again-1")

    replayed = api.as_user(operator).post(f"/api/v1/messages/{original.pk}/replay")
    assert replayed.json()["outcome"] == "confirmed", replayed.content
    [copy] = stored(1, origin=original)
    assert (copy.replay_count, copy.status) == (1, Status.PENDING)
    original.refresh_from_db()
    assert original.status == Status.REPLAYED  # the stored status is unchanged: state is derived

    client.force_login(operator)
    listed = client.get(reverse("messages"), {"queue": "again.orders"}).content.decode()
    row = row_of(listed, original.pk)
    assert "status-died_again" in row and "status-replayed" not in row
    assert f'href="{reverse("message", args=[copy.pk])}"' in row
    assert "status-pending" in row_of(listed, copy.pk)

    detail = client.get(reverse("message", args=[original.pk])).content.decode()
    assert re.search(r'id="message-status">died again<', detail)
    assert f'href="{reverse("message", args=[copy.pk])}" id="died-again-copy"' in detail
    history = detail.split('id="history"')[1].split("</table>")[0]
    assert "confirmed, then dead-lettered again" in history
    assert "outcome-confirmed" not in history

    listed_api = by_id(api.get("/api/v1/messages", queue="again.orders"))
    assert (listed_api[original.pk]["state"], listed_api[original.pk]["died_again_copy"]) == (
        "died_again",
        copy.pk,
    )
    assert (listed_api[original.pk]["status"], listed_api[copy.pk]["state"]) == (
        "replayed",
        "pending",
    )
    assert listed_api[copy.pk]["died_again_copy"] is None
    one = api.get(f"/api/v1/messages/{original.pk}").json()
    assert (one["state"], one["died_again_copy"]) == ("died_again", copy.pk)

    # The consumer is fixed and the original is replayed again: that replay did not come back
    # (the copy of the first one does not count against it), its first attempt still did.
    consumer.reject = False
    assert api.post(f"/api/v1/messages/{original.pk}/replay").json()["outcome"] == "confirmed"
    wait_for(lambda: consumer.seen["again-1"] == 3, message="the second replay consumed")
    one = api.get(f"/api/v1/messages/{original.pk}").json()
    assert (one["state"], one["died_again_copy"]) == ("replayed", None)
    detail = client.get(reverse("message", args=[original.pk])).content.decode()
    assert re.search(r'id="message-status">replayed<', detail)
    outcomes = re.findall(
        r'class="outcome outcome-(\w+)">([^<]+)<', detail.split('id="history"')[1]
    )
    assert outcomes == [
        ("confirmed", "confirmed"),  # newest first
        ("died_again", "confirmed, then dead-lettered again"),
    ]


def test_a_job_shows_how_many_of_its_replays_died_again(
    collector, amqp, client, api, operator, consumers
):
    declare_app_queue(amqp, "again.broken")
    declare_app_queue(amqp, "again.fixed")
    broken = dead_letters("again.broken", 4)
    fixed = dead_letters("again.fixed", 3)
    consumers("again.broken", reject=True)
    healthy = consumers("again.fixed")
    job = create_job(
        operator,
        message_ids=[m.pk for m in broken + fixed],
        breaker_threshold_pct=0,  # the breaker is not what this test is about
    )

    assert run(job) == "done"
    copies = stored(4, origin__in=broken)
    wait_for(lambda: healthy.total == 3, message="the healthy queue's 3 consumed")
    copy_of = {c.origin_id: c.pk for c in copies}

    client.force_login(operator)
    page = client.get(reverse("job", args=[job.pk])).content.decode()
    died = page.split('id="job-died-again"')[1].split("</p>")[0]
    assert "<strong>4</strong> of its 7 replayed messages died again" in died
    for copy in copies:
        assert f'href="{reverse("message", args=[copy.pk])}"' in died
    attempts = page.split('id="job-attempts"')[1].split("</table>")[0]
    assert attempts.count("confirmed, then dead-lettered again") == 4
    assert attempts.count("outcome outcome-confirmed") == 3
    for message in broken:
        assert f'href="{reverse("message", args=[copy_of[message.pk]])}"' in attempts

    listed = client.get(reverse("messages"), {"status": "replayed"}).content.decode()
    for message in broken:
        assert "status-died_again" in row_of(listed, message.pk)
    for message in fixed:
        assert "status-replayed" in row_of(listed, message.pk)

    body = api.as_user(operator).get(f"/api/v1/replay-jobs/{job.pk}").json()
    assert body["died_again"]["count"] == 4
    assert sorted(body["died_again"]["copies"]) == sorted(c.pk for c in copies)
    states = by_id(api.get("/api/v1/messages", status="replayed"))
    assert {pk: (m["state"], m["died_again_copy"]) for pk, m in states.items()} == {
        **{m.pk: ("died_again", copy_of[m.pk]) for m in broken},
        **{m.pk: ("replayed", None) for m in fixed},
    }


def test_the_list_asks_once_per_page_however_many_rows_died_again(client, viewer):
    def page_queries(queue, died):
        for _ in range(died):
            original = make_message(source_queue=queue, status=Status.REPLAYED, replay_count=1)
            make_message(source_queue=queue, origin=original, replay_count=1)
        make_message(source_queue=queue, status=Status.REPLAYED, replay_count=2)
        with CaptureQueriesContext(connection) as queries:
            html = client.get(reverse("messages"), {"queue": queue}).content.decode()
        assert html.count("status-died_again") == died
        return len(queries)

    client.force_login(viewer)
    assert page_queries("few.died", 1) == page_queries("many.died", 20)
