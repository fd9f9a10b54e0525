"""What an operator does from the console, on the real broker: replay (anywhere, later),
discard and restore, edit and replay, bulk actions, and jobs (preview, start, watch, cancel)."""

import json

import pytest

from recovery.models import Activity, Message, MessageEdit, ReplayJob
from tests.helpers import make_message
from tests.helpers.collector import receive

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def queues(amqp):
    names = []

    def declare(name):
        amqp.queue_delete(name)
        amqp.queue_declare(name, durable=True)
        names.append(name)
        return name

    yield declare
    for name in names:
        amqp.queue_delete(name)


def stored_in(vhost, queue, **fields):
    return make_message(vhost=vhost, source_queue=queue, routing_keys=[queue], **fields)


def test_it_replays_to_a_chosen_queue(client, operator, wired, amqp, queues):
    queues("app.src")
    queues("app.elsewhere")
    message = stored_in(wired, "app.src", body=b"to elsewhere", message_id="t-1")
    client.force_login(operator)

    response = client.post(
        f"/messages/{message.pk}/replay", {"queue": "app.elsewhere"}, HTTP_HX_REQUEST="true"
    )

    assert response.status_code == 200
    assert "Replayed to (default) / app.elsewhere" in response.content.decode()
    props, body = receive(amqp, "app.elsewhere")
    assert (props.message_id, body) == ("t-1", b"to elsewhere")
    assert amqp.queue_declare("app.src", passive=True).method.message_count == 0


def test_it_replays_later_through_a_delay_queue(client, operator, wired, queues):
    queues("app.later")
    message = stored_in(wired, "app.later")
    client.force_login(operator)

    response = client.post(f"/messages/{message.pk}/replay", {"delay_seconds": "10"})

    assert response.status_code == 302
    attempt = message.attempts.get()
    assert attempt.outcome == "confirmed" and "delayed 10s" in attempt.detail


def test_a_bad_target_is_refused_and_nothing_is_sent(client, operator, wired):
    message = stored_in(wired, "app.x")
    client.force_login(operator)
    both = client.post(
        f"/messages/{message.pk}/replay",
        {"queue": "q", "exchange": "e"},
        HTTP_HX_REQUEST="true",
    )
    bad_delay = client.post(
        f"/messages/{message.pk}/replay", {"delay_seconds": "7"}, HTTP_HX_REQUEST="true"
    )
    assert both.status_code == 400 and "not both" in both.content.decode()
    assert bad_delay.status_code == 400 and "Select a valid choice" in bad_delay.content.decode()
    assert not message.attempts.exists()


def test_a_returned_replay_says_so_and_stays_pending(client, operator, wired):
    message = stored_in(wired, "app.nobody-home")
    client.force_login(operator)
    response = client.post(f"/messages/{message.pk}/replay", HTTP_HX_REQUEST="true")
    html = response.content.decode()
    assert "Replay returned" in html and "NO_ROUTE" in html
    message.refresh_from_db()
    assert message.status == "pending"


def test_discard_and_restore(client, operator, wired):
    message = stored_in(wired, "app.y")
    client.force_login(operator)

    discarded = client.post(
        f"/messages/{message.pk}/discard", {"reason": "test data"}, HTTP_HX_REQUEST="true"
    )
    assert 'id="restore-button"' in discarded.content.decode()
    message.refresh_from_db()
    assert (message.status, message.status_reason) == ("discarded", "test data")
    again = client.post(f"/messages/{message.pk}/discard", HTTP_HX_REQUEST="true")
    assert again.status_code == 409 and "discarded" in again.content.decode()

    client.post(f"/messages/{message.pk}/restore")
    message.refresh_from_db()
    assert message.status == "pending"
    actions = list(Activity.objects.filter(message=message).values_list("action", flat=True))
    assert sorted(actions) == ["discard", "restore"]


def test_edit_and_replay_sends_the_edit_and_keeps_the_original(
    client, operator, wired, amqp, queues
):
    queues("app.edit")
    message = stored_in(
        wired, "app.edit", body=b'{"qty": 1}', headers={"tenant": "acme", "x-death": []}
    )
    client.force_login(operator)
    form = client.get(f"/messages/{message.pk}/edit").context["form"]
    headers = json.loads(form.initial["headers"])
    headers["tenant"] = "globex"

    response = client.post(
        f"/messages/{message.pk}/edit",
        {"headers": json.dumps(headers), "body": '{"qty": 2}'},
    )

    assert response.status_code == 302
    props, body = receive(amqp, "app.edit")
    assert body == b'{"qty": 2}' and props.headers["tenant"] == "globex"
    message.refresh_from_db()
    assert message.body_bytes == b'{"qty": 1}' and message.headers["tenant"] == "acme"
    edit = MessageEdit.objects.get(message=message)
    assert edit.user == operator and bytes(edit.body) == b'{"qty": 2}'
    assert message.attempts.get().edited
    page = client.get(f"/messages/{message.pk}/").content.decode()
    assert "edited copy by otto" in page and "globex" in page and "{&quot;qty&quot;: 2}" in page


def test_edit_refuses_headers_that_are_not_a_table(client, operator, wired):
    message = stored_in(wired, "app.edit2")
    client.force_login(operator)
    for bad, error in [("[1, 2]", "must be a JSON object"), ("{oops", "Not valid JSON")]:
        response = client.post(f"/messages/{message.pk}/edit", {"headers": bad, "body": "x"})
        assert response.status_code == 200 and error in response.content.decode()
    tagged = client.post(
        f"/messages/{message.pk}/edit",
        {"headers": '{"when": {"$t": "martian", "v": 1}}', "body": "x"},
    )
    assert "Not a valid header table" in tagged.content.decode()
    assert not message.attempts.exists()


def test_bulk_discard(client, operator, wired):
    kept = stored_in(wired, "app.bulk")
    a, b = stored_in(wired, "app.bulk"), stored_in(wired, "app.bulk")
    client.force_login(operator)
    response = client.post(
        "/messages/bulk",
        {"action": "discard", "ids": [a.pk, b.pk], "reason": "noise", "next": "/messages/"},
    )
    assert response.status_code == 302 and response["Location"] == "/messages/"
    statuses = dict(Message.objects.values_list("pk", "status"))
    assert (statuses[a.pk], statuses[b.pk], statuses[kept.pk]) == (
        "discarded",
        "discarded",
        "pending",
    )


def test_discard_everything_a_filter_matches_asks_first_then_goes_on_in_steps(
    client, operator, wired, monkeypatch
):
    from recovery.replay import curation

    junk = [stored_in(wired, "app.junk", reason="expired") for _ in range(5)]
    other = stored_in(wired, "app.junk", reason="rejected")
    client.force_login(operator)
    listing = client.get("/messages/", {"queue": "app.junk"}).content.decode()
    assert 'id="discard-for-filter"' in listing
    url = "/messages/discard?queue=app.junk&reason=expired"

    asked = client.get(url).content.decode()
    assert "<strong>5</strong> pending, poisoned or replayed messages match" in asked
    assert Message.objects.filter(status="discarded").count() == 0  # asking changes nothing

    # Steps of 2 and no time to spare: each POST does one step (at least one, always).
    monkeypatch.setattr(curation, "BY_FILTER_BATCH", 2)
    monkeypatch.setattr(curation, "BY_FILTER_BUDGET_S", 1e-9)
    first = client.post(url, {"reason": "ttl storm"})
    assert first.status_code == 200
    page = first.content.decode()
    assert "Discarded 2 message(s)." in page
    assert "<strong>3</strong> matching messages still to go" in page
    assert 'id="discard-matching-button"' in page and 'value="ttl storm"' in page
    while (response := client.post(url, {"reason": "ttl storm"})).status_code == 200:
        pass
    assert response.status_code == 302 and response["Location"] == (
        "/messages/?queue=app.junk&reason=expired"
    )
    assert [Message.objects.get(pk=m.pk).status for m in junk] == ["discarded"] * 5
    assert Message.objects.get(pk=other.pk).status == "pending"
    logged = Activity.objects.filter(action="discard", via="console")
    assert logged.count() == 5 and {a.user_id for a in logged} == {operator.pk}
    assert {a.detail["reason"] for a in logged} == {"ttl storm"}

    # And back: the list of discarded ones offers to restore them all.
    discarded = client.get("/messages/", {"queue": "app.junk", "status": "discarded"})
    assert 'id="restore-for-filter"' in discarded.content.decode()
    back = "/messages/restore?queue=app.junk&status=discarded"
    assert "<strong>5</strong> discarded messages match" in client.get(back).content.decode()
    while (response := client.post(back)).status_code == 200:
        pass
    assert [Message.objects.get(pk=m.pk).status for m in junk] == ["pending"] * 5
    assert Activity.objects.filter(action="restore", via="console").count() == 5


def test_discard_by_filter_needs_a_filter_and_an_operator(client, operator, viewer, wired):
    message = stored_in(wired, "app.keep")
    client.force_login(operator)
    empty_form = "/messages/?kind=&queue=&reason=&status=&q="
    assert 'id="discard-for-filter"' not in client.get(empty_form).content.decode()
    page = client.get("/messages/discard").content.decode()
    assert 'id="discard-needs-filter"' in page and 'id="discard-matching-button"' not in page
    client.post("/messages/discard", {"reason": "all of it"})
    client.post("/messages/discard?kind=nonsense", {"reason": "x"})
    client.force_login(viewer)
    assert client.get("/messages/discard?queue=app.keep").status_code == 403
    assert client.post("/messages/discard?queue=app.keep").status_code == 403
    assert 'id="discard-for-filter"' not in client.get("/messages/?queue=app.keep").content.decode()
    assert client.post("/messages/restore?queue=app.keep").status_code == 403
    assert Message.objects.get(pk=message.pk).status == "pending"


def test_bulk_input_is_checked(client, operator):
    client.force_login(operator)
    for data in [
        {"action": "replay"},
        {"action": "replay", "ids": ["x"]},
        {"action": "nuke", "ids": ["1"]},
    ]:
        response = client.post("/messages/bulk", data, follow=True)
        assert response.status_code == 200
        assert response.context["messages"]  # the flash says what was wrong
    assert not ReplayJob.objects.exists()


def test_bulk_replay_makes_a_job_that_runs_to_done(client, operator, wired, queues, job_tasks):
    queues("app.many")
    messages = [stored_in(wired, "app.many") for _ in range(5)]
    client.force_login(operator)

    response = client.post(
        "/messages/bulk", {"action": "replay", "ids": [m.pk for m in messages[:4]]}
    )

    job = ReplayJob.objects.get()
    assert response["Location"] == f"/jobs/{job.pk}/"
    assert job_tasks(job) == "done" or job.state == "done"
    page = client.get(f"/jobs/{job.pk}/", HTTP_HX_REQUEST="true", HTTP_HX_TARGET="job-progress")
    html = page.content.decode()
    assert "done" in html and "4/4 confirmed" in html and "hx-trigger" not in html


def test_a_job_from_a_filter_with_preview(client, operator, viewer, wired, queues, job_tasks):
    queues("app.f1")
    for _ in range(3):
        stored_in(wired, "app.f1", reason="expired")
    stored_in(wired, "app.f1", reason="rejected")
    client.force_login(viewer)
    preview = client.get(
        "/jobs/new",
        {"queue": "app.f1", "reason": "expired", "preview": "1"},
        HTTP_HX_REQUEST="true",
        HTTP_HX_TARGET="preview",
    )
    html = preview.content.decode()
    assert "Dry run: 3 message(s)" in html and "app.f1" in html
    assert 'id="start-job"' not in client.get("/jobs/new", {"queue": "app.f1"}).content.decode()

    client.force_login(operator)
    response = client.post(
        "/jobs/new", {"queue": "app.f1", "reason": "expired", "rate": "100", "ids": ""}
    )

    job = ReplayJob.objects.get()
    assert response.status_code == 302
    assert job.filters == {"queue": "app.f1", "reason": "expired"} and job.rate == 100
    job_tasks(job)
    assert (job.state, job.confirmed) == ("done", 3)


def test_a_job_without_a_selection_is_refused(client, operator):
    client.force_login(operator)
    response = client.post("/jobs/new", {"rate": "5"})
    assert response.status_code == 200
    assert "replaying the whole store by accident" in response.content.decode()
    nothing = client.post("/jobs/new", {"queue": "no-such-queue"})
    assert "no replayable message matches" in nothing.content.decode()
    assert not ReplayJob.objects.exists()


def test_cancel_a_queued_job(client, operator, wired, queues, job_tasks):
    queues("app.c")
    message = stored_in(wired, "app.c")
    client.force_login(operator)
    client.post("/messages/bulk", {"action": "replay", "ids": [message.pk]})
    job = ReplayJob.objects.get()

    response = client.post(f"/jobs/{job.pk}/cancel", HTTP_HX_REQUEST="true")

    assert response.status_code == 200 and "cancelled" in response.content.decode()
    again = client.post(f"/jobs/{job.pk}/cancel", HTTP_HX_REQUEST="true")
    assert again.status_code == 409
    job.refresh_from_db()
    assert job.state == "cancelled"
    assert Activity.objects.filter(action="job_cancelled", job=job).exists()


def test_the_job_list_polls_only_while_a_job_is_active(
    client, viewer, operator, wired, queues, job_tasks
):
    queues("app.p")
    message = stored_in(wired, "app.p")
    client.force_login(operator)
    client.post("/messages/bulk", {"action": "replay", "ids": [message.pk]})
    assert 'hx-trigger="every 1s"' in client.get("/jobs/").content.decode()
    job_tasks(ReplayJob.objects.get())
    assert "hx-trigger" not in client.get("/jobs/").content.decode()


def test_a_job_for_a_failure_group(client, operator, wired, queues, job_tasks):
    queues("app.g")
    for _ in range(2):
        stored_in(wired, "app.g", group_key="g-timeouts")
    stored_in(wired, "app.g", group_key="g-other")
    client.force_login(operator)
    form = client.get("/jobs/new", {"group": "g-timeouts"})
    assert "failure group app.g · rejected" in form.content.decode()

    client.post("/jobs/new", {"group": "g-timeouts"})

    job = ReplayJob.objects.get()
    assert (job.group_key, job.filters) == ("g-timeouts", {})
    job_tasks(job)
    assert job.confirmed == 2
