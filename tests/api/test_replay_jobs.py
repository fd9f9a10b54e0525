"""replay-jobs over the API: start one (retried with one Idempotency-Key), watch it, preview,
cancel, resume; validation names the field. The job runs through the real engine and broker."""

import pytest

from recovery.models import ReplayJob
from tests.helpers import drain, make_user
from tests.helpers.api import make_message


def run_like_a_worker(job_id):
    """What a Celery worker does with the job's task, in this thread."""
    from recovery.replay.tasks import run_replay_job

    job = ReplayJob.objects.get(pk=job_id)
    return run_replay_job(job.pk, str(job.token))


@pytest.mark.django_db(transaction=True)
def test_a_job_started_twice_with_one_key_runs_once(api_as, amqp, app_queue, celery_on_test_vhost):
    client = api_as(make_user("o", "operator"))
    for _ in range(5):
        make_message(source_queue=app_queue)
    request = {"filters": {"queue": app_queue}, "rate": 500, "breaker_threshold_pct": 0}
    key = {"Idempotency-Key": "nightly-cleanup-1"}
    first = client.post("/api/v1/replay-jobs", request, headers=key)
    assert first.status_code == 201, first.content
    job = first.json()
    assert first["Location"] == f"/api/v1/replay-jobs/{job['id']}"
    assert job["state"] == "queued" and job["created_by"] == "o" and job["via"] == "api"
    again = client.post("/api/v1/replay-jobs", request, headers=key)
    assert again.status_code == 201 and again["Idempotent-Replayed"] == "true"
    assert again.json()["id"] == job["id"] and again["Location"] == first["Location"]
    assert ReplayJob.objects.count() == 1

    run_like_a_worker(job["id"])
    watched = client.get(f"/api/v1/replay-jobs/{job['id']}").json()
    assert watched["state"] == "done"
    assert watched["progress"]["confirmed"] == 5 and watched["progress"]["percent"] == 100.0
    assert len(drain(amqp, app_queue)) == 5


def test_ids_and_groups_select_messages_and_the_preview_counts_them(api_as, operator_api, wired):
    a, b = make_message(source_queue="q.a", group_key="ga"), make_message(source_queue="q.b")
    viewer = api_as(make_user("v", "viewer"))
    preview = viewer.post("/api/v1/replay-jobs/dry-run", {"message_ids": [a.pk, b.pk]})
    assert preview.status_code == 200, preview.content
    assert preview.json()["total"] == 2
    assert {(t["exchange"], t["routing_key"]) for t in preview.json()["targets"]} == {
        ("", "q.a"),
        ("", "q.b"),
    }
    to_queue = viewer.post(
        "/api/v1/replay-jobs/dry-run", {"group_key": "ga", "target_queue": "elsewhere"}
    ).json()
    assert to_queue["targets"] == [
        {"vhost": a.vhost, "exchange": "", "routing_key": "elsewhere", "via": "", "count": 1}
    ]
    created = operator_api.post("/api/v1/replay-jobs", {"group_key": "ga", "rate": 10})
    assert created.status_code == 201, created.content
    assert created.json()["group_key"] == "ga" and created.json()["rate"] == 10


@pytest.mark.parametrize(
    "body,field",
    [
        ({}, "non_field_errors"),
        ({"filters": {"kind": "grue"}}, "filters.kind"),
        ({"filters": {"since": "yesterday"}}, "filters.since"),
        ({"message_ids": ["x"]}, "message_ids.0"),
        ({"message_ids": []}, "message_ids"),
        ({"group_key": "nothing-matches"}, "non_field_errors"),
        ({"group_key": "g1", "target_queue": "q", "target_exchange": "x"}, "target_queue"),
        ({"group_key": "g1", "delay_seconds": 7}, "delay_seconds"),
        ({"group_key": "g1", "rate": 0}, "rate"),
        ({"group_key": "g1", "canary_max_failure_pct": 101}, "canary_max_failure_pct"),
        ({"filters": {"status": "discarded"}}, "filters"),
    ],
)
def test_a_bad_job_is_a_400_naming_the_field(operator_api, wired, body, field):
    make_message(group_key="g1")
    response = operator_api.post("/api/v1/replay-jobs", body)
    assert response.status_code == 400, response.content
    assert field in response.json()["errors"], response.json()
    assert not ReplayJob.objects.exists()


def test_cancel_and_resume(operator_api, wired):
    make_message(group_key="g-cancel")
    job = operator_api.post("/api/v1/replay-jobs", {"group_key": "g-cancel"}).json()
    url = f"/api/v1/replay-jobs/{job['id']}"
    assert operator_api.post(f"{url}/resume").status_code == 409  # not paused
    cancelled = operator_api.post(f"{url}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"
    again = operator_api.post(f"{url}/cancel")
    assert again.status_code == 409 and again.json()["code"] == "conflict"
    paused = ReplayJob.objects.create(group_key="g-cancel", state=ReplayJob.State.PAUSED)
    resumed = operator_api.post(f"/api/v1/replay-jobs/{paused.pk}/resume")
    assert resumed.status_code == 200 and resumed.json()["state"] == "queued"


def test_the_job_list_filters_by_state_and_pages(operator_api, wired):
    for state in ("done", "done", "paused", "cancelled"):
        ReplayJob.objects.create(group_key="g", state=state)
    done = operator_api.get("/api/v1/replay-jobs", {"state": "done", "page_size": 1}).json()
    assert len(done["results"]) == 1 and done["next"]
    assert operator_api.get(done["next"]).json()["results"][0]["state"] == "done"
    assert operator_api.get("/api/v1/replay-jobs", {"state": "nope"}).status_code == 400
