"""A failure group's own page, previous/next through a list or a group, and comparing two
messages side by side."""

import datetime
import re

import pytest
from django.utils import timezone

from recovery.models import Membership, Message, Team, TeamScope
from tests.helpers import make_message, make_user

pytestmark = pytest.mark.django_db


def group_of_three():
    now = timezone.now().replace(microsecond=0)
    made = [
        make_message(
            source_queue="orders",
            group_key="g-orders",
            group_label="orders · rejected · TimeoutError",
            headers={"x-exception-type": "TimeoutError"},
            body=f'{{"order": {n}, "why": "timeout"}}\nsecond line'.encode(),
            collected_at=now - datetime.timedelta(minutes=30 - n),
        )
        for n in range(3)
    ]
    make_message(source_queue="billing", group_key="g-billing", collected_at=now)
    return made


def test_a_group_page_has_its_card_and_its_messages_with_a_body_preview(client, operator):
    oldest, middle, newest = group_of_three()
    Message.objects.filter(pk=middle.pk).update(status="replayed")
    client.force_login(operator)

    html = client.get("/groups/g-orders/").content.decode()

    card = html[html.index('id="group-card"') : html.index("</section>")]
    assert "orders · rejected · TimeoutError" in card and ">TimeoutError<" in card
    assert 'id="group-open">2<' in card and 'id="group-total">3<' in card
    assert oldest.collected_at.strftime("%Y-%m-%d %H:%M:%S") in card  # first seen
    assert newest.collected_at.strftime("%Y-%m-%d %H:%M:%S") in card  # last seen
    assert 'href="/jobs/new?group=g-orders"' in card  # Replay group
    table = html[html.index('id="group-messages"') :]
    rows = table.split("<tr>")[2:]
    assert [
        f"/messages/{m.pk}/" in row for row, m in zip(rows, [newest, middle, oldest], strict=True)
    ] == [True] * 3  # newest first
    assert "{&quot;order&quot;: 2, &quot;why&quot;: &quot;timeout&quot;}" in rows[0]
    assert "second line" not in table
    assert "g-billing" not in html
    assert 'name="group"' not in html  # no hash in a filter box
    # Each message links back here: the detail page says "← Group" and pages through it.
    assert "?back=group%3Dg-orders" in rows[0]


def test_a_group_that_is_not_there_or_not_yours_is_a_404(client, viewer):
    make_message(source_queue="payments", group_key="g-pay")
    payments = Team.objects.create(name="payments")
    orders = Team.objects.create(name="orders")
    TeamScope.objects.create(team=payments, vhost="/", queue_pattern="payments")
    TeamScope.objects.create(team=orders, vhost="/", queue_pattern="orders")
    outsider = make_user("olly", None)
    Membership.objects.create(user=outsider, team=orders, role="viewer")
    client.force_login(viewer)
    assert client.get("/groups/nope/").status_code == 404
    client.force_login(outsider)
    assert client.get("/groups/g-pay/").status_code == 404
    theirs = Message.objects.get(group_key="g-pay")
    mine = make_message(source_queue="orders", group_key="g-mine")
    assert client.get("/messages/compare", {"a": mine.pk, "b": theirs.pk}).status_code == 404
    assert client.get("/messages/compare", {"a": mine.pk, "b": mine.pk}).status_code == 200


def test_previous_and_next_follow_the_list_it_came_from_filter_included(client, viewer):
    oldest, middle, newest = group_of_three()
    client.force_login(viewer)

    html = client.get(f"/messages/{middle.pk}/", {"back": "group=g-orders"}).content.decode()
    assert f'href="/messages/{newest.pk}/?back=group%3Dg-orders" id="newer-message"' in html
    assert f'href="/messages/{oldest.pk}/?back=group%3Dg-orders" id="older-message"' in html
    assert 'href="/groups/g-orders/" id="back-to-list">← Group' in html

    html = client.get(f"/messages/{newest.pk}/", {"back": "queue=orders"}).content.decode()
    assert 'id="newer-message"' not in html  # the billing message is newer, but not in the list
    assert f'href="/messages/{middle.pk}/?back=queue%3Dorders" id="older-message"' in html
    assert 'href="/messages/?queue=orders" id="back-to-list">← Messages' in html

    # A search term keeps to the search: only the middle message has "order": 1, "why".
    back = 'q="order": 1, "why"'
    html = client.get(f"/messages/{middle.pk}/", {"back": back}).content.decode()
    assert "the only message in this list" in html

    html = client.get(f"/messages/{middle.pk}/").content.decode()  # no list: no neighbours
    assert 'id="newer-message"' not in html and 'id="older-message"' not in html


def test_compare_shows_where_headers_properties_and_bodies_differ(client, viewer):
    a = make_message(
        headers={"x-tenant": "acme", "x-retry": 1},
        body=b'{"order": 1, "sku": "A-1", "qty": 2}',
    )
    b = make_message(
        headers={"x-tenant": "acme", "x-retry": 2, "x-new": "yes"},
        body=b'{"order": 1, "sku": "A-1", "qty": 3}',
    )
    client.force_login(viewer)

    html = client.get("/messages/compare", {"a": a.pk, "b": b.pk}).content.decode()

    headers = html[html.index('id="compare-headers"') :].split("</table>")[0]
    rows = {
        re.search(r'<th scope="row" class="mono">([^< ]+)', row)[1]: row
        for row in headers.split("<tr")[2:]
    }
    assert "differs" in rows["x-retry"] and "differs" in rows["x-new"]
    assert "differs" not in rows["x-tenant"]
    assert "(absent)" in rows["x-new"]
    diff = html[html.index('id="body-diff"') :].split("</pre>")[0]
    assert '<span class="diff-removed">-  &quot;qty&quot;: 2</span>' in diff
    assert '<span class="diff-added">+  &quot;qty&quot;: 3</span>' in diff
    assert "sku" in diff  # context lines around the change

    same = make_message(body=a.body_bytes)
    html = client.get("/messages/compare", {"a": a.pk, "b": same.pk}).content.decode()
    assert 'id="body-same"' in html


def test_compare_needs_two_messages_the_user_may_see(client, viewer, operator):
    a = make_message()
    client.force_login(viewer)
    assert client.get("/messages/compare", {"a": a.pk}).status_code == 404
    assert client.get("/messages/compare", {"a": a.pk, "b": "x"}).status_code == 404
    assert client.get("/messages/compare", {"a": a.pk, "b": a.pk + 999}).status_code == 404
    client.force_login(operator)
    one = client.post("/messages/bulk", {"action": "compare", "ids": [a.pk]}, follow=True)
    assert "Compare needs exactly two selected messages." in one.content.decode()
    b = make_message()
    two = client.post("/messages/bulk", {"action": "compare", "ids": [a.pk, b.pk]})
    assert two.status_code == 302 and two.url == f"/messages/compare?a={a.pk}&b={b.pk}"
