"""A bulk replay job started from a selection, watched live until it is done."""

import re

import pytest
from django.conf import settings
from playwright.sync_api import expect

from recovery.models import ReplayJob
from tests.helpers import make_message

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

COUNT = 12


def test_a_bulk_job_runs_and_the_page_follows_it_to_done(tab, operator, amqp, job_worker):
    amqp.queue_delete("app.bulk")
    amqp.queue_declare("app.bulk", durable=True)
    vhost = settings.RECOVERY_VHOSTS[0]
    for i in range(COUNT):
        make_message(
            vhost=vhost, source_queue="app.bulk", routing_keys=["app.bulk"], message_id=f"bulk-{i}"
        )
    make_message(vhost=vhost, source_queue="app.other", message_id="not-selected")

    tab.login("otto")
    tab.goto("/messages/?queue=app.bulk")
    expect(tab.page.locator("#message-table tbody tr")).to_have_count(COUNT)
    tab.page.check("input[data-select-all]")  # console.js ticks every row
    expect(tab.page.locator('input[name="ids"]:checked')).to_have_count(COUNT)
    tab.page.click('button[name="action"][value="job"]')

    expect(tab.page.locator("#job-summary")).to_have_text(f"{COUNT} selected message(s)")
    tab.page.fill('input[name="rate"]', "8")
    tab.page.click("#preview-button")
    expect(tab.page.locator("#preview h2")).to_have_text(f"Dry run: {COUNT} message(s)")
    tab.screenshot("job-form")
    tab.page.click("#start-job")

    expect(tab.page).to_have_url(re.compile(r"/jobs/\d+/$"))
    expect(tab.page.locator("#job-state")).to_have_text("queued")
    job = ReplayJob.objects.get()
    job_worker.start(job)
    expect(tab.page.locator("#job-state")).to_have_text("running", timeout=10_000)
    tab.screenshot("running")
    expect(tab.page.locator("#job-state")).to_have_text("done", timeout=30_000)
    expect(tab.page.locator(f"#job-{job.pk}-counts")).to_contain_text(f"{COUNT}/{COUNT} confirmed")
    expect(tab.page.locator("#job-attempts tbody tr")).to_have_count(COUNT)
    expect(tab.page.locator("#job-attempts")).to_contain_text("confirmed")
    tab.screenshot("done")
    assert amqp.queue_declare("app.bulk", passive=True).method.message_count == COUNT
    assert tab.errors == [], tab.errors
