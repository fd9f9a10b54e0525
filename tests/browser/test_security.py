"""Hostile message content stays inert; viewers get no controls and are refused if they post."""

import pytest
from playwright.sync_api import expect

from tests.helpers import make_message

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

HOSTILE_BODY = (
    b'<script>window.__xss = "body"; alert("body")</script>'
    b"<img src=x onerror=\"window.__xss = 'img'; alert('img')\">"
    b"<svg onload=\"alert('svg')\"></svg>"
)


def test_a_script_body_and_hostile_headers_stay_inert(tab, viewer):
    message = make_message(
        body=HOSTILE_BODY,
        content_type="text/html",
        message_id='"><script>alert("id")</script>',
        headers={"x-evil": "<script>alert('header')</script>", "<b>": "<i>bold</i>"},
        group_label="<img src=x onerror=alert('group')>",
    )
    tab.login("vera")

    response = tab.goto(f"/messages/{message.pk}/")

    policy = response.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "unsafe-inline" not in policy
    expect(tab.page.locator("#body-text")).to_contain_text('<script>window.__xss = "body"')
    expect(tab.page.locator("#headers")).to_contain_text("<script>alert('header')</script>")
    tab.page.goto(tab.url("/messages/"))
    tab.page.wait_for_load_state("networkidle")
    tab.page.goto(tab.url(f"/messages/{message.pk}/"))
    tab.page.wait_for_load_state("networkidle")
    tab.screenshot("hostile-detail")
    assert tab.dialogs == []
    assert tab.page.evaluate("() => window.__xss") is None
    assert tab.page.locator("img[src=x]").count() == 0


def test_a_viewer_has_no_replay_button_and_is_refused(tab, viewer):
    message = make_message()
    tab.login("vera")
    tab.goto(f"/messages/{message.pk}/")

    expect(tab.page.locator("#message-status")).to_have_text("pending")
    expect(tab.page.locator("#replay-button")).to_have_count(0)
    expect(tab.page.locator("#discard-button")).to_have_count(0)
    tab.screenshot("viewer-detail")
    status = tab.page.evaluate(
        """async (url) => {
            const token = JSON.parse(document.body.getAttribute("hx-headers"))["X-CSRFToken"];
            const response = await fetch(url, {method: "POST", headers: {"X-CSRFToken": token}});
            return response.status;
        }""",
        f"/messages/{message.pk}/replay",
    )
    assert status == 403
    message.refresh_from_db()
    assert (message.status, message.replay_count) == ("pending", 0)
