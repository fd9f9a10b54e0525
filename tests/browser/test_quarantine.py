"""The quarantine page in Chromium: an operator sees what the collector could not store, with
its reason, opens its headers and first bytes, and retries it; a screenshot at desktop and phone
width lands in test-artifacts/."""

import pytest
from playwright.sync_api import expect

from recovery.collector.consumer import start_collectors, stop_collectors
from tests.helpers.collector import depth, fill_quarantine, stored

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

LIMIT = 64 * 1024


def test_an_operator_finds_a_quarantined_message_and_retries_it(
    tab, operator, wired, clean_queues, amqp
):
    fill_quarantine(amqp, {"too-big-1": b"{" + b"x" * LIMIT + b"}"}, LIMIT)
    tab.login("otto")
    tab.goto("/")
    tab.page.click("text=Quarantine")
    row = tab.page.locator("table.quarantined tbody tr").first
    expect(row).to_contain_text("too-big-1")
    expect(row).to_contain_text(f"body {LIMIT + 2} B > limit {LIMIT} B")
    tab.page.locator("summary", has_text="Headers and properties").first.click()
    expect(tab.page.locator("pre", has_text='"tenant": "acme"').first).to_be_visible()
    tab.screenshot("quarantine-desktop")
    tab.page.set_viewport_size({"width": 390, "height": 844})
    tab.screenshot("quarantine-phone")
    tab.page.set_viewport_size({"width": 1400, "height": 900})

    stop_event, threads = start_collectors(flush_seconds=0.05, max_body_bytes=LIMIT * 4)
    try:
        row.get_by_role("button", name="Retry").click()
        expect(tab.page.locator("#flash")).to_contain_text("sent back to recovery.dead_letters")
        stored(message_id="too-big-1")
    finally:
        stop_collectors(stop_event, threads)
    assert depth(amqp, "recovery.quarantine") == 0
    expect(tab.page.locator(".empty").first).to_contain_text("Empty")
    assert tab.errors == [], tab.errors
