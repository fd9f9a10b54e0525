"""The alerts pages in Chromium: an admin adds a channel and a rule, the rule's page shows it; a
rule that cannot check is "unknown" on both pages, with no "ok" badge."""

import pytest
from playwright.sync_api import expect

from recovery.alerts.engine import evaluate
from recovery.models import AlertRule, NotificationChannel

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_an_admin_sets_up_a_channel_and_a_rule(tab, admin_user):
    tab.login("ada")
    tab.goto("/alerts/")
    expect(tab.page.locator("#alert-rules")).to_contain_text("nothing tells anyone")
    tab.page.fill("#id_channel-name", "on-call hook")
    tab.page.select_option("#id_channel-kind", "webhook")
    tab.page.fill("#id_channel-target", "http://127.0.0.1:9/hook")
    tab.page.click('#new-channel button[type="submit"]')
    expect(tab.page.locator("#channels")).to_contain_text("on-call hook")

    tab.page.fill("#id_rule-name", "orders backlog")
    tab.page.select_option("#id_rule-kind", "open_messages")
    tab.page.fill("#id_rule-params", '{"threshold": 100}')
    tab.page.check("#new-rule input[name='rule-channels']")
    tab.page.click('#new-rule button[type="submit"]')
    expect(tab.page.locator("#alert-rules")).to_contain_text("orders backlog")
    rule = AlertRule.objects.get(name="orders backlog")
    assert rule.params == {"threshold": 100}
    assert list(rule.channels.all()) == [NotificationChannel.objects.get(name="on-call hook")]

    tab.page.click("#alert-rules a:has-text('orders backlog')")
    # Beat has not evaluated it yet: not a green "ok".
    expect(tab.page.locator("#rule-state")).to_have_text("unknown: never evaluated")
    expect(tab.page.locator("#transitions")).to_contain_text("Never changed state")
    evaluate()
    tab.page.reload()
    expect(tab.page.locator("#rule-state")).to_have_text("ok")
    tab.screenshot("alert-rule")
    assert tab.errors == [], tab.errors


def test_a_rule_that_cannot_check_is_unknown_on_the_list_and_its_page(tab, viewer):
    # Saved before params were checked: its check raised AttributeError every evaluation and the
    # list showed a green "ok" beside an amber "cannot check".
    broken = AlertRule.objects.create(
        name="audit typed as a number", kind="audit", params={"missing_after": 6}
    )
    evaluate()
    tab.login("vera")
    tab.goto("/alerts/")
    listed = tab.page.locator(f"#rule-{broken.pk}")
    expect(listed.locator(".badge")).to_have_text(["unknown"])
    expect(listed.locator(".badge.ok")).to_have_count(0)
    expect(listed).to_contain_text("cannot check: InvalidParams")
    expect(tab.page.locator("#unknown-count")).to_have_text("1 unknown")

    listed.locator("a").click()
    expect(tab.page.locator("#rule-state")).to_have_text("unknown")
    expect(tab.page.locator("h1 .badge")).to_have_text(["unknown"])
    expect(tab.page.locator(".badge.ok")).to_have_count(0)
    expect(tab.page.locator("p.error[role=alert]")).to_contain_text("Cannot check: InvalidParams")
    tab.screenshot("unknown-rule")
    assert tab.errors == [], tab.errors
