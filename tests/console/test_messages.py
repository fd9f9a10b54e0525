"""The message list: filters through the shared form, keyset pages, htmx fragments."""

import datetime
import html
import re

import pytest
from django.utils import timezone

from tests.helpers import make_message

pytestmark = pytest.mark.django_db


def ids_on(response):
    return [m.pk for m in response.context["messages_page"]]


def test_it_filters_by_kind_queue_exchange_reason_status_and_time(client, viewer):
    now = timezone.now()
    wanted = make_message(source_queue="orders", reason="expired", collected_at=now)
    make_message(source_queue="orders", reason="rejected", collected_at=now)
    make_message(source_queue="payments", reason="expired", collected_at=now)
    make_message(
        source_queue="orders", reason="expired", collected_at=now - datetime.timedelta(days=2)
    )
    make_message(kind="unroutable", source_queue="", source_exchange="shop", reason="no_route")
    client.force_login(viewer)

    since = (now - datetime.timedelta(hours=1)).strftime("%Y-%m-%d %H:%M:%S")
    response = client.get(
        "/messages/",
        {
            "kind": "dead_letter",
            "queue": "orders",
            "reason": "expired",
            "status": "pending",
            "exchange": "shop",
            "since": since,
        },
    )
    assert ids_on(response) == [wanted.pk]


def test_an_invalid_filter_says_which_field(client, viewer):
    client.force_login(viewer)
    response = client.get("/messages/", {"kind": "eaten-by-a-grue", "since": "yesterday-ish"})
    html = response.content.decode()
    assert response.status_code == 200
    assert "kind:" in html and "since:" in html
    assert response.context["messages_page"] == []


def test_keyset_pages_walk_every_message_once_newest_first(client, viewer):
    same_instant = timezone.now()
    made = [make_message(collected_at=same_instant) for _ in range(60)]  # ties broken by id
    made += [
        make_message(collected_at=same_instant - datetime.timedelta(seconds=i))
        for i in range(1, 61)
    ]
    client.force_login(viewer)

    seen, params = [], {}
    for _ in range(5):
        response = client.get("/messages/", params)
        seen += ids_on(response)
        before = response.context["next_before"]
        if before is None:
            break
        params = {"before": before}
    assert sorted(seen) == sorted(m.pk for m in made)
    assert len(seen) == len(set(seen)) == 120
    expected = sorted(made, key=lambda m: (m.collected_at, m.pk), reverse=True)
    assert seen == [m.pk for m in expected]


def test_the_next_page_link_keeps_the_filters(client, viewer):
    for _ in range(55):
        make_message(source_queue="orders")
    client.force_login(viewer)
    response = client.get("/messages/", {"queue": "orders"})
    before = response.context["next_before"]
    html = response.content.decode()
    assert f'href="?queue=orders&amp;before={before}"' in html
    assert f'hx-get="?queue=orders&amp;before={before}"' in html


def test_an_htmx_filter_request_gets_the_table_fragment_only(client, viewer):
    make_message(message_id="frag-1")
    client.force_login(viewer)
    response = client.get(
        "/messages/", {"q": "frag-1"}, HTTP_HX_REQUEST="true", HTTP_HX_TARGET="message-table"
    )
    html = response.content.decode()
    assert html.lstrip().startswith('<div id="message-table">')
    assert "frag-1" in html and "<html" not in html


def test_the_filter_form_works_without_javascript(client, viewer):
    client.force_login(viewer)
    html = client.get("/messages/").content.decode()
    assert 'method="get" action="/messages/"' in html  # a plain form submit
    assert 'hx-get="/messages/"' in html


def test_it_links_a_job_for_everything_matching_the_filter(client, operator):
    make_message(source_queue="orders")
    client.force_login(operator)
    html = client.get("/messages/", {"queue": "orders", "status": "pending"}).content.decode()
    assert 'href="/jobs/new?queue=orders&amp;status=pending"' in html


def test_back_to_the_list_keeps_its_filter_and_page(client, viewer):
    target = make_message(source_queue="app.back", reason="expired")
    client.force_login(viewer)
    page = client.get("/messages/", {"queue": "app.back", "reason": "expired"}).content.decode()
    link = re.search(rf'href="(/messages/{target.pk}/\?back=[^"]+)"', page).group(1)
    detail = client.get(html.unescape(link)).content.decode()
    back = re.search(r'href="([^"]*)" id="back-to-list"', detail)
    assert back and html.unescape(back.group(1)) == "/messages/?queue=app.back&reason=expired"
    hostile = client.get(
        f"/messages/{target.pk}/", {"back": '"><script>x</script>&next=//evil'}
    ).content.decode()
    assert "<script>x" not in hostile and 'href="//evil' not in hostile
