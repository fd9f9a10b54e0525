"""The console in a real browser: login, overview charts, filter and search, detail, replay."""

import re

import pytest
from playwright.sync_api import expect

from recovery.models import Message
from tests.helpers import declare_app_queue, make_message, publish
from tests.helpers.collector import receive, reject_all, stored

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_it_logs_in_and_shows_the_overview_with_live_charts(tab, operator, wired):
    make_message(source_queue="orders")
    make_message(kind="unroutable", source_queue="", source_exchange="shop", reason="no_route")

    tab.goto("/")
    assert "/login/" in tab.page.url
    tab.screenshot("login")
    tab.login("otto")

    expect(tab.page.locator("h1")).to_have_text("Overview")
    expect(tab.page.locator("#total-count")).to_have_text("2")
    expect(tab.page.locator('canvas#trend-24h[data-rendered="1"]')).to_have_count(1)
    datasets = tab.page.evaluate(
        "() => Chart.getChart(document.getElementById('trend-24h')).data.datasets.length"
    )
    assert datasets == 2  # dead_letter and unroutable
    # The broker half arrives by htmx after the page.
    expect(tab.page.locator("#live")).to_contain_text("recovery.dead_letters")
    tab.screenshot("overview")
    assert tab.errors == [] and tab.dialogs == [], tab.errors


def test_it_filters_and_searches_the_message_list(tab, viewer):
    make_message(message_id="alpha-1", source_queue="orders", reason="rejected")
    make_message(message_id="beta-2", source_queue="payments", reason="expired")
    make_message(
        message_id="gamma-3",
        source_queue="orders",
        reason="rejected",
        headers={"tenant": "Zeta Corp"},
    )
    tab.login("vera")
    tab.goto("/messages/")
    rows = tab.page.locator("#message-table tbody tr")
    expect(rows).to_have_count(3)

    tab.page.select_option('select[name="reason"]', "expired")  # htmx swaps the table
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text("beta-2")
    expect(tab.page).to_have_url(re.compile(r"reason=expired"))
    tab.screenshot("filtered")

    tab.page.select_option('select[name="reason"]', "")
    tab.page.fill('input[name="q"]', "zeta corp")  # a header value, any case
    tab.page.press('input[name="q"]', "Enter")
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text("gamma-3")
    tab.screenshot("searched")
    assert tab.errors == [], tab.errors


def test_it_opens_a_real_dead_letter_and_replays_it(tab, operator, collector, amqp):
    declare_app_queue(amqp, "app.browser")
    publish(
        amqp, "app.browser", b'{"hello": "browser"}', message_id="br-1", headers={"tenant": "acme"}
    )
    reject_all(amqp, "app.browser", 1)
    [message] = stored(message_id="br-1")

    tab.login("otto")
    tab.goto("/messages/?q=br-1")
    tab.page.click("text=br-1")
    # The detail page knows the list it came from, and "← Messages" goes back to it.
    expect(tab.page).to_have_url(re.compile(rf"/messages/{message.pk}/\?back=q%3Dbr-1$"))
    expect(tab.page.locator("#back-to-list")).to_have_attribute("href", "/messages/?q=br-1")
    expect(tab.page.locator("#message-status")).to_have_text("pending")
    expect(tab.page.locator("#body-json")).to_contain_text('"hello": "browser"')
    expect(tab.page.locator("#headers")).to_contain_text("acme")
    expect(tab.page.locator("ol.timeline")).to_contain_text("rejected")
    tab.screenshot("detail")

    tab.page.click("#replay-button")

    expect(tab.page.locator("#message-status")).to_have_text("replayed")
    tab.screenshot("replayed")
    props, body = receive(amqp, "app.browser")
    assert (props.message_id, body) == ("br-1", b'{"hello": "browser"}')
    tab.page.reload()
    expect(tab.page.locator("#history")).to_contain_text("confirmed")
    assert tab.errors == [], tab.errors


def test_an_operator_discards_everything_a_filter_matches(tab, operator):
    for n in range(3):
        make_message(message_id=f"junk-{n}", source_queue="loadtest")
    make_message(message_id="real-1", source_queue="orders")
    tab.login("otto")
    tab.goto("/messages/")
    tab.page.fill('input[name="queue"]', "loadtest")
    tab.page.press('input[name="queue"]', "Enter")  # htmx swaps the table and its controls
    expect(tab.page.locator("#message-table tbody tr")).to_have_count(3)

    tab.page.click("#discard-for-filter")
    expect(tab.page.locator("#discard-count")).to_contain_text("3 pending, poisoned or replayed")
    tab.page.fill('input[name="reason"]', "load test traffic")
    tab.screenshot("discard-by-filter")
    tab.page.click("#discard-matching-button")

    expect(tab.page.locator("#flash")).to_contain_text("Discarded 3 message(s).")
    expect(tab.page).to_have_url(re.compile(r"/messages/\?queue=loadtest"))
    expect(tab.page.locator("#message-table .status-discarded")).to_have_count(3)
    tab.goto("/messages/?queue=orders")
    expect(tab.page.locator("#message-table .status-pending")).to_have_count(1)
    assert tab.errors == [], tab.errors


def test_bulk_actions_wait_for_a_selection(tab, operator):
    for n in range(3):
        make_message(message_id=f"bulk-{n}")
    tab.login("otto")
    tab.goto("/messages/")
    replay, discard, job = (
        tab.page.locator(f"#bulk-{name}") for name in ("replay", "discard", "job")
    )
    count = tab.page.locator("#selected-count")
    for button in (replay, discard, job):
        expect(button).to_be_disabled()
    expect(count).to_have_text("0")
    pk = Message.objects.get(message_id="bulk-1").pk
    tab.page.check(f'input[aria-label="Select message {pk}"]')
    expect(count).to_have_text("1")
    for button in (replay, discard, job):
        expect(button).to_be_enabled()
    tab.page.check('input[data-select-all="ids"]')
    expect(count).to_have_text("3")
    tab.page.uncheck('input[data-select-all="ids"]')
    expect(count).to_have_text("0")
    expect(replay).to_be_disabled()
    assert tab.errors == [], tab.errors
