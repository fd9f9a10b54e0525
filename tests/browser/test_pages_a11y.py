"""The pages an operator reaches first at 3 a.m., in Chromium at desktop and phone width: each is
screenshotted into test-artifacts/, has no serious or critical axe-core violation, and does not
scroll sideways on a phone. And the path through them: groups → a group's page → a message →
the next one in the group → comparing the two.

axe-core is vendored from npm (tests/browser/vendor/README.md) and run with Playwright's
evaluate, which the console's Content-Security-Policy does not apply to."""

import datetime
import json
from pathlib import Path

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from recovery.models import AuditRun
from tests.helpers import make_message
from tests.helpers.collector import fill_quarantine

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

AXE = (Path(__file__).parent / "vendor" / "axe-4.11.0.min.js").read_text()
DESKTOP = {"width": 1400, "height": 900}
PHONE = {"width": 390, "height": 844}
KEY = "g-timeouts"


def a_group():
    now = timezone.now()
    return [
        make_message(
            source_queue="orders.fulfilment",
            group_key=KEY,
            group_label="orders.fulfilment · rejected · TimeoutError",
            headers={"x-exception-type": "TimeoutError", "x-attempt": n},
            body=json.dumps({"order": f"ord-{n}", "qty": n, "sku": "A-1"}).encode(),
            collected_at=now - datetime.timedelta(minutes=5 - n),
        )
        for n in range(3)
    ]


def serious_violations(tab):
    tab.page.evaluate(AXE)
    result = tab.page.evaluate(
        "axe.run(document, {runOnly: ['wcag2a', 'wcag2aa', 'best-practice']})"
    )
    return [
        f"{v['id']} ({v['impact']}): {v['help']} at {[n['target'] for n in v['nodes']][:3]}"
        for v in result["violations"]
        if v["impact"] in ("serious", "critical")
    ]


def test_the_first_pages_read_on_a_desktop_and_a_phone_with_no_serious_axe_violation(
    tab, operator, wired, clean_queues, amqp
):
    messages = a_group()
    fill_quarantine(amqp, {"too-big-a11y": b"{" + b"x" * 2048 + b"}"}, 1024)
    run = AuditRun.objects.create(
        date=timezone.now().date(),
        status="succeeded",
        totals={"lost": 2, "distinct_published": 100, "dead_lettered": 3, "recovered": 1},
        warnings=[{"code": "input_gaps", "count": 1}],
    )
    pages = {
        "overview": "/",
        "messages": f"/messages/?group={KEY}",
        "groups": "/groups/",
        "group-page": f"/groups/{KEY}/",
        "job-flow": f"/jobs/new?group={KEY}",
        "quarantine": "/quarantine/",
        "message": f"/messages/{messages[1].pk}/?back=group%3D{KEY}",
        "compare": f"/messages/compare?a={messages[0].pk}&b={messages[1].pk}",
        "audit-report": f"/audits/{run.pk}/",
    }
    tab.login("otto")
    found, wide = {}, {}
    for width_name, size in (("desktop", DESKTOP), ("phone", PHONE)):
        tab.page.set_viewport_size(size)
        for name, path in pages.items():
            response = tab.goto(path)
            assert response.status == 200, f"{path}: {response.status}"
            tab.screenshot(f"{name}-{width_name}")
            found[f"{name} at {width_name}"] = serious_violations(tab)
            if width_name == "desktop":
                # List tables read as cards on a phone only: on a desktop they are tables whose
                # header cells stand above their columns.
                misaligned = tab.page.evaluate(
                    """() => [...document.querySelectorAll('table.cards')].filter(t => {
                        const th = t.querySelector('thead th'), td = t.querySelector('tbody td');
                        return getComputedStyle(t).display !== 'table' || (th && td &&
                            Math.abs(th.getBoundingClientRect().left
                                     - td.getBoundingClientRect().left) > 1);
                    }).map(t => t.className)"""
                )
                assert misaligned == [], f"{path}: {misaligned} do not read as tables"
            if width_name == "phone":
                width = tab.page.evaluate("document.documentElement.scrollWidth")
                if width > PHONE["width"]:
                    wide[path] = width
    assert {page: v for page, v in found.items() if v} == {}
    assert wide == {}, f"pages wider than {PHONE['width']} px: {wide}"
    assert tab.errors == [], tab.errors


def test_an_operator_goes_from_a_group_to_its_messages_and_compares_two(tab, operator):
    oldest, middle, newest = a_group()
    tab.login("otto")
    tab.goto("/groups/")
    tab.page.get_by_role("link", name="orders.fulfilment · rejected · TimeoutError").click()
    expect(tab.page).to_have_url(f"{tab.base_url}/groups/{KEY}/")
    expect(tab.page.locator("#group-exception")).to_have_text("TimeoutError")
    expect(tab.page.locator("#group-open")).to_have_text("3")
    rows = tab.page.locator("#group-messages tbody tr")
    expect(rows).to_have_count(3)
    expect(rows.first).to_contain_text('"order": "ord-2"')  # the newest, its body previewed
    rows.first.locator("a").first.click()
    expect(tab.page.locator("h1")).to_contain_text(f"#{newest.pk}")
    expect(tab.page.locator("#newer-message")).to_have_count(0)  # the newest of the group
    tab.page.click("#older-message")
    expect(tab.page.locator("h1")).to_contain_text(f"#{middle.pk}")
    expect(tab.page.locator("#newer-message")).to_be_visible()
    expect(tab.page.locator("#back-to-list")).to_have_text("← Group")
    expect(tab.page.locator("#compare-with")).to_have_value(str(oldest.pk))
    tab.page.get_by_role("button", name="Compare").click()
    expect(tab.page.locator("#compare-headers tr.differs")).to_contain_text("x-attempt")
    expect(tab.page.locator("#body-diff .diff-removed").first).to_contain_text('"ord-1"')
    expect(tab.page.locator("#body-diff .diff-added").first).to_contain_text('"ord-0"')
    tab.screenshot("compare")
    tab.page.go_back()
    tab.page.click("#back-to-list")
    expect(tab.page).to_have_url(f"{tab.base_url}/groups/{KEY}/")
    assert tab.errors == [], tab.errors
