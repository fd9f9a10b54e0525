"""Everything an operator needs works with JavaScript switched off: links and plain forms."""

import pytest
from playwright.sync_api import expect

from tests.helpers import make_message

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_navigation_filters_and_a_replay_work_without_javascript(tab_without_js, operator, wired):
    tab = tab_without_js
    make_message(message_id="keep-1", reason="rejected")
    # Nothing is bound to this queue in the test vhost: the broker returns the replay.
    lost = make_message(
        message_id="nowhere-1", reason="expired", vhost=wired, source_queue="nowhere"
    )
    tab.login("otto")

    for link, heading in [
        ("Messages", "Messages"),
        ("Failure groups", "Failure groups"),
        ("Replay jobs", "Replay jobs"),
        ("Audits", "Audits"),
        ("Activity", "Activity log"),
        ("Overview", "Overview"),
    ]:
        tab.page.click(f'header nav >> text="{link}"')
        expect(tab.page.locator("h1")).to_have_text(heading)

    tab.page.click('header nav >> text="Messages"')
    tab.page.select_option('select[name="reason"]', "expired")
    tab.page.click('#message-filters button[type="submit"]')
    rows = tab.page.locator("#message-table tbody tr")
    expect(rows).to_have_count(1)
    tab.page.click("text=nowhere-1")
    tab.page.click("#replay-button")  # a plain form POST with the CSRF token field

    expect(tab.page.locator(".flash")).to_contain_text("returned")
    expect(tab.page.locator("#message-status")).to_have_text("pending")
    lost.refresh_from_db()
    assert "NO_ROUTE" in lost.status_reason
