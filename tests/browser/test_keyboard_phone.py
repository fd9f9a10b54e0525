"""The console by keyboard and on a phone (#28): a skip link first, j/k through list rows with
one tab stop per row, and at 390 px the navigation and filters collapse, list rows read as cards
and no page scrolls sideways. Screenshots at phone width land in test-artifacts/."""

import re

import pytest
from playwright.sync_api import expect

from recovery.models import Message
from tests.helpers import make_message

pytestmark = pytest.mark.browser

PHONE = {"width": 390, "height": 844}
PAGES = [
    "/",
    "/messages/",
    "/groups/",
    "/jobs/",
    "/alerts/",
    "/audits/",
    "/activity/",
    "/history/",
    "/broker/",
    "/quarantine/",
]


def test_the_keyboard_path_skip_link_then_j_and_k_through_rows(tab, viewer):
    for n in range(3):
        make_message(message_id=f"key-{n}")
    newest_first = list(
        Message.objects.order_by("-collected_at", "-id").values_list("pk", flat=True)
    )
    tab.login("vera")
    tab.goto("/messages/")
    tab.page.keyboard.press("Tab")
    expect(tab.page.locator("#skip-link")).to_be_focused()
    tab.page.keyboard.press("Enter")
    expect(tab.page.locator("#main")).to_be_focused()
    tab.page.keyboard.press("j")
    focused = tab.page.locator("a[data-row-link]:focus")
    expect(focused).to_have_attribute("href", re.compile(rf"^/messages/{newest_first[0]}/"))
    tab.page.keyboard.press("j")
    expect(focused).to_have_attribute("href", re.compile(rf"^/messages/{newest_first[1]}/"))
    tab.page.keyboard.press("k")
    expect(focused).to_have_attribute("href", re.compile(rf"^/messages/{newest_first[0]}/"))
    # One tab stop per row: Tab from a row's link goes to the next row's.
    tab.page.keyboard.press("Tab")
    expect(focused).to_have_attribute("href", re.compile(rf"^/messages/{newest_first[1]}/"))
    tab.page.keyboard.press("Enter")
    expect(tab.page).to_have_url(re.compile(rf"/messages/{newest_first[1]}/"))
    # Typing j in a field types it.
    tab.goto("/messages/")
    tab.page.fill('input[name="q"]', "")
    tab.page.locator('input[name="q"]').press("j")
    expect(tab.page.locator('input[name="q"]')).to_have_value("j")
    assert tab.errors == [], tab.errors


def test_at_phone_width_nothing_scrolls_sideways_and_rows_are_cards(tab, operator):
    for n in range(3):
        make_message(message_id=f"phone-{n}-" + "x" * 60, source_queue="a.rather.long.queue.name")
    tab.page.set_viewport_size(PHONE)
    tab.login("otto")
    detail = f"/messages/{Message.objects.first().pk}/"
    for path in [*PAGES, detail]:
        tab.goto(path)
        width = tab.page.evaluate("document.documentElement.scrollWidth")
        assert width <= PHONE["width"], f"{path} is {width} px wide at {PHONE['width']} px"
    tab.goto("/messages/")
    nav = tab.page.locator("nav[aria-label=Main]")
    expect(nav).to_be_hidden()  # collapsed behind "Menu"
    expect(tab.page.locator(".filters-menu form")).to_be_hidden()
    tab.screenshot("messages-phone")
    tab.page.click("summary >> text=Menu")
    expect(nav.get_by_role("link", name="Failure groups")).to_be_visible()
    tab.screenshot("menu-phone")
    tab.page.click("summary >> text=Menu")
    expect(tab.page.locator("table.messages thead")).to_be_hidden()
    row = tab.page.locator("table.messages tbody tr").first
    box = row.bounding_box()
    assert box and box["width"] <= PHONE["width"]
    expect(row).to_contain_text("phone-")
    tab.goto("/groups/")
    tab.screenshot("groups-phone")
    tab.page.set_viewport_size({"width": 1400, "height": 900})
    tab.goto("/messages/")
    expect(nav).to_be_visible()  # a wide screen keeps it open
    assert tab.errors == [], tab.errors
