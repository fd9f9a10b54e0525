"""Break-glass unmask in Chromium (#32): the reason is asked for, the body shows unmasked, the
unmask expires (UNMASK_SECONDS shrunk to a few seconds here), and the activity log shows it."""

import json
import time

import pytest
from playwright.sync_api import expect

from recovery.models import Activity, MaskRule, Unmask, set_privileges
from tests.helpers import make_message, make_user

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

CARD = "4000056655665556"
UNMASK_SECONDS = 4


def test_a_user_unmasks_with_a_reason_and_it_expires(tab, settings):
    settings.UNMASK_SECONDS = UNMASK_SECONDS
    MaskRule.objects.create(kind="json_path", pattern="$.card.number")
    message = make_message(body=json.dumps({"card": {"number": CARD}, "amount": 12}).encode())
    user = make_user("una", "operator")
    set_privileges(user, unmask=True)

    tab.login("una")
    tab.goto(f"/messages/{message.pk}/")
    expect(tab.page.locator("#masked-notice")).to_be_visible()
    expect(tab.page.locator("#body-json")).to_contain_text("[masked]")
    assert CARD not in tab.page.content()
    expect(tab.page.locator("#edit-needs-unmask")).to_be_visible()

    # No reason: the browser asks for one and nothing is unmasked.
    tab.page.click("#unmask-button")
    assert tab.page.locator("#unmask-reason").evaluate("e => !e.validity.valid")
    assert not Unmask.objects.exists()

    tab.page.fill("#unmask-reason", "INC-7 card declined twice")
    tab.page.click("#unmask-button")
    expect(tab.page.locator("#unmasked-notice")).to_contain_text("INC-7 card declined twice")
    expect(tab.page.locator("#body-json")).to_contain_text(CARD)
    expect(tab.page.locator("#edit-link")).to_be_visible()
    tab.screenshot("unmasked")

    unmask = Unmask.objects.get()
    time.sleep(max(0.0, (unmask.expires_at - unmask.created_at).total_seconds() + 0.5))
    tab.page.reload()
    expect(tab.page.locator("#masked-notice")).to_be_visible()
    expect(tab.page.locator("#body-json")).to_contain_text("[masked]")
    assert CARD not in tab.page.content()

    tab.goto(f"/activity/?message={message.pk}&user=una")
    table = tab.page.locator("table.activity")
    expect(table).to_contain_text("unmask")
    expect(table).to_contain_text("INC-7 card declined twice")
    expect(table).to_contain_text("body_view")
    assert Activity.objects.filter(action="body_view", detail__unmasked=True).count() == 1
    assert tab.errors == []
