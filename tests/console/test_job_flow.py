"""The bulk job flow in the console (#28): what will be sent is shown before "Start job", blanks
are explained, the group is named by its label, a running job shows its ETA and the canary's
countdown, and a cancelled job offers to replay the rest."""

import datetime
import re

import pytest
from django.utils import timezone

from recovery.models import ReplayJob, ReplayJobItem
from tests.helpers import make_message

pytestmark = pytest.mark.django_db


def test_a_group_job_shows_its_count_and_target_before_start_and_its_label_after(client, operator):
    for _ in range(3):
        make_message(source_queue="orders", group_key="g-orders", group_label="orders · rejected")
    client.force_login(operator)
    page = client.get("/jobs/new", {"group": "g-orders"}).content.decode()
    assert 'id="preview-targets"' in page and "Dry run: 3 message(s)" in page
    assert re.search(r'id="start-job">Start job: 3 messages<', page)
    assert "Rate blank</strong>: as fast as the broker confirms" in page
    assert "Canary size blank or 0</strong>: no canary" in page
    assert 'id="preview-targets"' not in client.get("/jobs/new").content.decode()

    job = ReplayJob.objects.create(created_by=operator, group_key="g-orders")
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert ">orders · rejected</a>" in page and ">g-orders</a>" not in page


def test_a_running_job_shows_its_eta_and_the_canarys_countdown(client, viewer, time_machine):
    time_machine.move_to("2026-11-26 12:00:00+00:00", tick=False)
    now = timezone.now()
    job = ReplayJob.objects.create(
        state=ReplayJob.State.RUNNING,
        filters={"queue": "orders"},
        total=1000,
        confirmed=100,
        rate=10,
        started_at=now - datetime.timedelta(seconds=10),
        canary_size=5,
        canary_pause_seconds=10,
        canary_sent_at=now - datetime.timedelta(seconds=3),
    )
    client.force_login(viewer)
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert 'id="job-eta">About 1 min left at its rate of 10.0 msgs/s' in page
    assert re.search(r'id="job-canary-wait">Canary sent: judging it in <strong>7 s</strong>', page)
    job.rate = None
    job.canary_passed_at = now
    job.save()
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    # 100 in 10 s: 900 left take 90 s at the pace so far; the canary is judged.
    assert 'id="job-eta">About 1 min left at the pace so far' in page
    assert 'id="job-canary-wait"' not in page


def test_a_cancelled_job_offers_to_replay_the_rest(client, operator):
    sent, unsent = make_message(), make_message()
    job = ReplayJob.objects.create(
        created_by=operator,
        state=ReplayJob.State.CANCELLED,
        message_ids=[sent.pk, unsent.pk],
        total=2,
        confirmed=1,
    )
    ReplayJobItem.objects.create(job=job, message=sent, state=ReplayJobItem.State.CONFIRMED)
    ReplayJobItem.objects.create(job=job, message=unsent, state=ReplayJobItem.State.PENDING)
    client.force_login(operator)
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    link = re.search(r'href="([^"]+)" id="job-replay-rest"', page)
    assert link and link.group(1) == f"/jobs/new?ids={unsent.pk}"
    assert "1 message(s) were not sent" in page
    follow = client.get(link.group(1)).content.decode()
    assert "Dry run: 1 message(s)" in follow
