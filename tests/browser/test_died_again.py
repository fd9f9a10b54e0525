"""A message replayed from the console that is dead-lettered again: its badge is not green and
takes the operator to the new copy (real broker, real collector)."""

import re

import pytest
from playwright.sync_api import expect

from recovery.models import Message
from tests.helpers import declare_app_queue, publish, wait_for

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# The green of "replayed" and "confirmed" (static/console.css: #d1fadf on var(--ok) #067647).
GREENS = {"rgb(209, 250, 223)", "rgb(6, 118, 71)"}


def reject_one(channel, queue):
    """Take the next message off ``queue`` and reject it (to recovery.dlx), as a broken
    consumer does."""

    def get():
        method, _props, _body = channel.basic_get(queue)
        return method

    method = wait_for(get, message=f"a message on {queue}")
    channel.basic_reject(method.delivery_tag, requeue=False)


def colours(locator):
    return set(
        locator.evaluate("e => [getComputedStyle(e).backgroundColor, getComputedStyle(e).color]")
    )


def test_a_message_that_died_again_is_not_green_and_links_its_new_copy(
    tab, operator, collector, amqp
):
    declare_app_queue(amqp, "app.again")
    publish(amqp, "app.again", b'{"order": 9}', message_id="again-browser")
    reject_one(amqp, "app.again")
    original = wait_for(
        lambda: Message.objects.filter(message_id="again-browser").first(),
        message="the dead letter stored",
    )

    tab.login("otto")
    tab.goto(f"/messages/{original.pk}/")
    tab.page.click("#replay-button")
    expect(tab.page.locator("#message-status")).to_have_text("replayed")
    reject_one(amqp, "app.again")  # the consumer is still broken
    copy = wait_for(
        lambda: Message.objects.filter(origin=original).first(), message="the copy collected"
    )

    tab.page.reload()
    badge = tab.page.locator("#message-status")
    expect(badge).to_have_text("died again")
    assert not colours(badge) & GREENS, colours(badge)
    outcome = tab.page.locator("#history .outcome")
    expect(outcome).to_have_text("confirmed, then dead-lettered again")
    assert not colours(outcome) & GREENS, colours(outcome)
    tab.screenshot("detail")

    tab.goto("/messages/?queue=app.again")
    listed = tab.page.locator("#message-table a.status-died_again")
    expect(listed).to_have_text(f"died again → #{copy.pk}")
    assert not colours(listed) & GREENS, colours(listed)
    tab.screenshot("list")
    listed.click()
    expect(tab.page).to_have_url(re.compile(rf"/messages/{copy.pk}/$"))
    expect(tab.page.locator("h1")).to_contain_text(f"#{copy.pk}")

    tab.goto(f"/messages/{original.pk}/")
    tab.page.click("#died-again-copy")
    expect(tab.page).to_have_url(re.compile(rf"/messages/{copy.pk}/$"))
    assert tab.errors == [], tab.errors
