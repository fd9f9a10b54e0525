"""Audit pages: runs, a report with per-hour charts and badges, and the evidence drill-down."""

import datetime
import json
import re

import pytest

from recovery.models import AuditEvidence, AuditRun
from tests.helpers import make_message
from tests.helpers.audit import HOUR, make_run

pytestmark = pytest.mark.django_db


def chart(html, element_id):
    match = re.search(rf'<script id="{element_id}" type="application/json">(.*?)</script>', html)
    return json.loads(match.group(1))


def test_the_run_list_shows_status_finality_and_totals(client, viewer):
    run = make_run()
    client.force_login(viewer)
    html = client.get("/audits/").content.decode()
    assert f'href="/audits/{run.pk}/"' in html
    assert "PROVISIONAL" in html and "succeeded" in html


def test_days_without_a_run_are_shown_as_not_run(client, viewer, time_machine):
    time_machine.move_to("2026-11-25 09:00:00+00:00", tick=False)
    for day in (24, 21, 20):  # nothing for the 22nd and 23rd
        AuditRun.objects.create(date=datetime.date(2026, 11, day), status="succeeded")
    client.force_login(viewer)
    html = client.get("/audits/").content.decode()
    days = re.findall(r"<tr( class=\"not-run\")?>\s*<td>(?:<a [^>]*>)?(2026-11-\d\d)", html)
    assert [(bool(missing), day) for missing, day in days] == [
        (False, "2026-11-24"),
        (True, "2026-11-23"),
        (True, "2026-11-22"),
        (False, "2026-11-21"),
        (False, "2026-11-20"),
    ]
    assert html.count("not run</span>") == 2
    time_machine.move_to("2026-11-27 09:00:00+00:00", tick=False)  # the nightly run missed two
    html = client.get("/audits/").content.decode()
    assert html.index("2026-11-26") < html.index("2026-11-25") < html.index("2026-11-24")
    assert html.count("not run</span>") == 4


def test_the_report_charts_loss_duplicates_and_latency_per_group(client, viewer):
    run = make_run()
    client.force_login(viewer)

    html = client.get(f"/audits/{run.pk}/").content.decode()

    lost = chart(html, "chart-lost-data")
    assert lost["labels"] == ["10:00", "11:00"]
    assert {d["label"]: d["data"] for d in lost["datasets"]} == {
        "billing": [2, 0],
        "shipping": [0, 0],
    }
    latency = {d["label"]: d["data"] for d in chart(html, "chart-latency-data")["datasets"]}
    assert latency == {"billing": [90, 55], "shipping": [30, None]}  # worst exchange's p95
    assert 'class="badge final"' in html and 'class="badge provisional"' in html
    assert "distinct_published" in html


def test_evidence_links_to_stored_messages_or_a_search(client, viewer):
    run = make_run()
    stored = make_message(message_id="lost-1")
    AuditEvidence.objects.create(
        run=run,
        kind="lost",
        message_id="lost-1",
        store_id=stored.pk,
        window_start=HOUR,
        exchange="orders",
        consumer_group="billing",
    )
    AuditEvidence.objects.create(
        run=run,
        kind="lost",
        message_id="lost-2",
        store_id=None,
        window_start=HOUR,
        exchange="orders",
        consumer_group="billing",
    )
    AuditEvidence.objects.create(run=run, kind="duplicate", message_id="dup-1", window_start=HOUR)
    client.force_login(viewer)

    report = client.get(f"/audits/{run.pk}/").content.decode()
    assert f'href="/audits/{run.pk}/evidence?kind=lost">2 lost' in report

    response = client.get(f"/audits/{run.pk}/evidence", {"kind": "lost"})
    html = response.content.decode()
    assert [e.message_id for e in response.context["rows"]] == ["lost-1", "lost-2"]
    assert f'href="/messages/{stored.pk}/"' in html
    assert 'href="/messages/?q=lost-2"' in html

    window = client.get(
        f"/audits/{run.pk}/evidence",
        {"window": "2026-11-20 10:00:00", "exchange": "orders", "consumer_group": "billing"},
    )
    assert len(window.context["rows"]) == 2


def test_the_report_headlines_the_loss_and_what_to_do_first(client, viewer):
    run = make_run()
    run.totals = {**run.totals, "dead_lettered": 10, "recovered": 7, "unverified": 4}
    run.warnings = [{"code": "input_gaps", "count": 1}, {"code": "unverified", "count": 4}]
    run.save()
    AuditEvidence.objects.create(
        run=run, kind="lost", message_id="l-1", window_start=HOUR, exchange="orders"
    )
    client.force_login(viewer)

    html = client.get(f"/audits/{run.pk}/").content.decode()

    headline = html[html.index('id="audit-headline"') : html.index("</section>")]
    assert (
        html.index('id="audit-headline"') < html.index('id="run-warnings"') < html.index("Totals")
    )
    assert "headline-bad" in html and "<strong>2 message(s) lost.</strong>" in headline
    assert "2 things the audit could not decide" in headline
    steps = re.findall(r"<li>(.*?)</li>", headline.split('id="audit-steps"')[1])
    assert steps[0].startswith("Find the 2 lost message(s)")
    assert f'href="/audits/{run.pk}/evidence?kind=lost"' in steps[0]
    assert steps[1].startswith("3 dead-lettered message(s) are not recovered yet")
    assert steps[2].startswith("Find the missing log files")
    assert steps[3].startswith("3 message(s) were processed more than once")
    totals = html[html.index('id="totals"') :].split("</table>")[0]
    labels = re.findall(r'<th title="([a-z_0-9]+)">', totals)
    assert labels[:3] == ["lost", "unverified", "dead_lettered"]  # loss first, not alphabetical
    assert "Published (distinct)" in totals


@pytest.mark.parametrize(
    "totals, warnings, verdict, tone",
    [
        ({"lost": 0, "distinct_published": 5}, [], "Nothing lost.", "ok"),
        (
            {"lost": 0, "distinct_published": 5},
            [{"code": "unclaimed", "count": 2}],
            "Nothing proven lost, but not everything could be checked.",
            "warn",
        ),
        ({"distinct_published": 5}, [], "This audit could not count losses.", "warn"),
    ],
)
def test_the_headline_is_green_only_when_nothing_is_lost_or_undecided(
    client, viewer, totals, warnings, verdict, tone
):
    run = AuditRun.objects.create(
        date=HOUR.date(), status="succeeded", totals=totals, warnings=warnings
    )
    client.force_login(viewer)
    html = client.get(f"/audits/{run.pk}/").content.decode()
    headline = html[html.index('id="audit-headline"') : html.index("</section>")]
    assert f"<strong>{verdict}</strong>" in headline
    assert f'class="headline headline-{tone}"' in html
    assert ("What to do first" in headline) is bool(warnings)


def recoverable_run():
    """A run with one truly lost message and three recoverable: two dead letters still in the
    store, one whose store row retention removed."""
    run = make_run()
    run.totals = {**run.totals, "lost": 1, "recoverable": 3}
    run.save()
    kept = [make_message(message_id=f"rec-{n}") for n in (1, 2)]
    for message_id, store_id in (("rec-1", kept[0].pk), ("rec-2", kept[1].pk), ("gone", 10**9)):
        AuditEvidence.objects.create(
            run=run,
            kind="recoverable",
            window_start=HOUR,
            exchange="orders",
            consumer_group="billing",
            message_id=message_id,
            store_id=store_id,
        )
    AuditEvidence.objects.create(
        run=run,
        kind="lost",
        window_start=HOUR,
        exchange="orders",
        consumer_group="billing",
        message_id="nowhere",
    )
    return run, kept


def test_the_report_leads_with_recoverable_and_truly_lost(client, viewer):
    run, _ = recoverable_run()
    client.force_login(viewer)
    html = client.get(f"/audits/{run.pk}/").content.decode()
    verdict = re.search(r'id="audit-verdict"><strong>(.*?)</strong>', html).group(1)
    assert verdict == "1 message(s) truly lost, 3 recoverable from Lazarus."
    steps = re.search(r'<ol id="audit-steps">(.*?)</ol>', html, re.S).group(1)
    assert steps.index("Replay the 3 recoverable") < steps.index("1 truly lost")
    assert "?kind=recoverable" in steps
    assert 'id="replay-recoverable"' not in html  # a viewer may not replay


def test_an_operator_replays_the_recoverable_as_one_job(client, operator):
    from recovery.models import Activity, ReplayJob

    run, kept = recoverable_run()
    client.force_login(operator)
    assert 'id="replay-recoverable"' in client.get(f"/audits/{run.pk}/").content.decode()
    response = client.post(f"/audits/{run.pk}/replay-recoverable")
    job = ReplayJob.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/jobs/{job.pk}/"
    assert sorted(job.message_ids) == sorted(m.pk for m in kept)  # the removed one is not asked
    assert job.created_by == operator
    assert Activity.objects.filter(action="job_created", user=operator).exists()


def test_a_viewer_may_not_replay_the_recoverable(client, viewer):
    from recovery.models import ReplayJob

    run, _ = recoverable_run()
    client.force_login(viewer)
    assert client.post(f"/audits/{run.pk}/replay-recoverable").status_code == 403
    assert not ReplayJob.objects.exists()
