"""audits: runs (by day, newest revision), one run with totals and windows, its evidence."""

import datetime

import pytest

from recovery.models import AuditEvidence, AuditRun, ReplayJob
from tests.helpers.api import make_audit, make_message


def test_last_nights_audit_newest_revision_first(viewer_api):
    night = datetime.date(2026, 11, 20)
    make_audit(night - datetime.timedelta(days=1))
    first = make_audit(night, revision=1)
    second = make_audit(night, revision=2)
    runs = viewer_api.get("/api/v1/audits", {"date": "2026-11-20"}).json()["results"]
    assert [r["id"] for r in runs] == [second.pk, first.pk]
    latest = viewer_api.get("/api/v1/audits", {"latest": "true"}).json()["results"]
    assert {(r["date"], r["revision"]) for r in latest} == {("2026-11-20", 2), ("2026-11-19", 1)}
    assert runs[0]["totals"]["distinct_published"] == 10


def test_a_run_carries_status_totals_windows_and_gaps(viewer_api):
    run = make_audit()
    body = viewer_api.get(f"/api/v1/audits/{run.pk}").json()
    assert body["status"] == "succeeded" and body["finality"] == "FINAL"
    assert body["totals"]["publish_attempts"] == 12 and body["totals"]["lost"] == 1
    [window] = body["windows"]
    assert window["exchange"] == "orders" and window["consumer_group"] == "billing"
    assert window["metrics"]["loss_ppm"] == 1e5
    assert body["evidence_counts"] == {"lost": 1}
    assert body["input_gaps"] == []


def test_evidence_links_to_the_store_and_filters(viewer_api):
    run = make_audit()
    stored = make_message(message_id="dup-1")
    AuditEvidence.objects.create(
        run=run,
        kind="duplicate",
        message_id="dup-1",
        cause="producer_retry",
        count=2,
        store_id=stored.pk,
    )
    url = f"/api/v1/audits/{run.pk}/evidence"
    duplicates = viewer_api.get(url, {"kind": "duplicate"}).json()["results"]
    assert [(e["message_id"], e["count"]) for e in duplicates] == [("dup-1", 2)]
    assert duplicates[0]["message"] == f"/api/v1/messages/{stored.pk}"
    lost = viewer_api.get(url, {"kind": "lost"}).json()["results"]
    assert lost[0]["message_id"] == "m-lost" and lost[0]["message"] is None
    assert viewer_api.get(url, {"kind": "stolen"}).status_code == 400
    assert viewer_api.get("/api/v1/audits/999999/evidence").status_code == 404


@pytest.mark.parametrize(
    "params,field",
    [({"date": "20-11-2026"}, "date"), ({"latest": "yes"}, "latest"), ({"status": "x"}, "status")],
)
def test_bad_audit_filters_name_the_field(viewer_api, params, field):
    response = viewer_api.get("/api/v1/audits", params)
    assert response.status_code == 400 and field in response.json()["errors"]


def test_a_running_audit_has_empty_totals(viewer_api):
    run = AuditRun.objects.create(date=datetime.date(2026, 11, 21))
    body = viewer_api.get(f"/api/v1/audits/{run.pk}").json()
    assert body["status"] == "running" and body["totals"] == {} and body["windows"] == []


def test_replay_the_recoverable_of_a_run(operator_api, viewer_api):
    run = make_audit()
    kept = make_message(message_id="rec-1")
    AuditEvidence.objects.create(
        run=run,
        kind="recoverable",
        exchange="orders",
        consumer_group="billing",
        message_id="rec-1",
        store_id=kept.pk,
    )
    url = f"/api/v1/audits/{run.pk}/replay-recoverable"
    assert viewer_api.post(url).status_code == 403
    response = operator_api.post(url)
    assert response.status_code == 201, response.content
    job = response.json()
    assert response["Location"] == f"/api/v1/replay-jobs/{job['id']}"
    assert job["state"] == "queued"
    assert ReplayJob.objects.get(pk=job["id"]).message_ids == [kept.pk]
    kinds = operator_api.get(f"/api/v1/audits/{run.pk}/evidence", {"kind": "recoverable"})
    assert [e["message_id"] for e in kinds.json()["results"]] == ["rec-1"]


def test_nothing_recoverable_is_404_and_all_removed_is_422(operator_api):
    run = make_audit()
    url = f"/api/v1/audits/{run.pk}/replay-recoverable"
    assert operator_api.post(url).status_code == 404
    AuditEvidence.objects.create(
        run=run,
        kind="recoverable",
        exchange="orders",
        consumer_group="billing",
        message_id="rec-9",
        store_id=10**9,  # retention removed it since
    )
    response = operator_api.post(url)
    assert response.status_code == 422
    assert response.json()["code"] == "nothing_recoverable"
