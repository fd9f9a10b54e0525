"""The overview: counts from the rollup, trend charts as JSON data, recent activity."""

import datetime
import json
import re

import pytest
from django.utils import timezone

from recovery.models import Activity, Message
from tests.helpers import declare_app_queue, make_message

pytestmark = pytest.mark.django_db


def chart_data(html, element_id):
    match = re.search(rf'<script id="{element_id}" type="application/json">(.*?)</script>', html)
    assert match, f"no json_script {element_id}"
    return json.loads(match.group(1))


def test_it_counts_by_kind_reason_and_source(client, viewer):
    make_message(source_queue="orders", reason="rejected")
    make_message(source_queue="orders", reason="expired")
    replayed = make_message(source_queue="payments", reason="rejected")
    Message.objects.filter(pk=replayed.pk).update(status="replayed")
    make_message(kind="unroutable", source_queue="", source_exchange="shop", reason="no_route")
    client.force_login(viewer)

    response = client.get("/")

    ctx = response.context
    assert ctx["total"] == 4 and ctx["open"] == 3
    assert {r["name"]: (r["open"], r["total"]) for r in ctx["by_kind"]} == {
        "dead_letter": (2, 3),
        "unroutable": (1, 1),
    }
    assert {r["name"]: r["total"] for r in ctx["by_reason"]} == {
        "rejected": 2,
        "expired": 1,
        "no_route": 1,
    }
    sources = {(s["queue"], s["exchange"]): (s["open"], s["total"]) for s in ctx["sources"]}
    assert sources[("orders", "shop")] == (2, 2)
    assert sources[("payments", "shop")] == (0, 1)
    assert sources[("", "shop")] == (1, 1)
    html = response.content.decode()
    assert 'href="/messages/?queue=orders&amp;vhost=%2F"' in html


def test_the_trend_charts_put_messages_in_their_hour_and_day(client, viewer):
    now = timezone.now()
    make_message(collected_at=now)
    make_message(collected_at=now)
    make_message(collected_at=now - datetime.timedelta(hours=3), kind="returned", reason="nack")
    make_message(collected_at=now - datetime.timedelta(days=3))
    make_message(collected_at=now - datetime.timedelta(days=30))  # outside both charts
    client.force_login(viewer)

    html = client.get("/").content.decode()

    day = chart_data(html, "trend-24h-data")
    assert len(day["labels"]) == 24
    series = {d["label"]: d["data"] for d in day["datasets"]}
    assert series["dead_letter"][-1] == 2
    assert series["returned"][-4] == 1
    assert sum(series["dead_letter"]) == 2
    week = chart_data(html, "trend-7d-data")
    assert len(week["labels"]) == 7
    assert week["labels"][-1] == now.strftime("%a %d")  # calendar days, today last
    assert sum(sum(d["data"]) for d in week["datasets"]) == 4
    assert 'data-chart="trend-24h-data"' in html


def test_it_has_no_inline_script_or_style(client, viewer):
    make_message()
    client.force_login(viewer)
    html = client.get("/").content.decode()
    for tag in re.findall(r"<script[^>]*>", html):
        assert "src=" in tag or 'type="application/json"' in tag, tag
    assert "<style" not in html and " style=" not in html
    assert "onclick" not in html


def test_it_lists_recent_activity_with_links(client, viewer, operator):
    message = make_message()
    Activity.objects.create(user=operator, action="replay", message=message, detail={"x": 1})
    client.force_login(viewer)
    html = client.get("/").content.decode()
    assert f'href="/messages/{message.pk}/"' in html and "otto" in html


def test_the_live_fragment_reports_broker_and_collector(client, viewer, wired):
    client.force_login(viewer)
    response = client.get("/overview/live", HTTP_HX_REQUEST="true")
    html = response.content.decode()
    assert response.status_code == 200
    assert "<html" not in html  # the fragment only
    assert "recovery.dead_letters" in html
    assert 'id="collector-down"' in html  # no collector threads in this test
    full = client.get("/overview/live").content.decode()
    assert "<html" in full  # and a page of its own without JavaScript


@pytest.mark.django_db(transaction=True)
def test_the_live_fragment_shows_running_collectors_and_their_lag(client, viewer, collector):
    from tests.helpers import wait_for

    client.force_login(viewer)
    html = wait_for(
        lambda: (lambda page: page if "badge ok" in page else None)(
            client.get("/overview/live", HTTP_HX_REQUEST="true").content.decode()
        ),
        message="the collectors' first heartbeat",
    )
    assert 'id="collector-sources"' in html and "recovery.returns" in html
    assert "not declared" not in html


def test_the_live_fragment_shows_each_quorum_queues_delivery_limit(client, viewer, amqp):
    declare_app_queue(amqp, "live.limited", **{"x-queue-type": "quorum", "x-delivery-limit": 4})
    try:
        client.force_login(viewer)
        html = client.get("/overview/live", HTTP_HX_REQUEST="true").content.decode()
        assert "<td>4, then dead-lettered to Lazarus</td>" in _row(html, "live.limited")
        assert "<td>unlimited</td>" in _row(html, "<strong>recovery.dead_letters</strong>")
    finally:
        amqp.queue_delete("live.limited")


def _row(html, name):
    return next(row for row in html.split("<tr>") if f">{name}</" in row)


def test_rates_and_uptimes_are_formatted_for_people(client, viewer, wired, settings):
    from console.templatetags.lazarus import duration
    from recovery.models import CollectorHeartbeat

    assert [duration(s) for s in (None, 45, 2112, 7500, 3 * 86400 + 4 * 3600)] == [
        "–",
        "45 s",
        "35 min",
        "2 h 5 min",
        "3 d 4 h",
    ]
    CollectorHeartbeat.objects.create(
        worker="host:1",
        vhost=wired,
        queue=settings.RECOVERY_DEAD_LETTER_QUEUE,
        rate=0.7630570986139744,
    )
    client.force_login(viewer)
    html = client.get("/overview/live", HTTP_HX_REQUEST="true").content.decode()
    assert "<td>0.8</td>" in html and "0.763" not in html
    page = client.get("/broker/?refresh=1").content.decode()
    uptime = re.search(r'<td title="(\d+) s">([^<]+)</td>', page)
    assert uptime, "the node's uptime"
    assert uptime.group(2) == duration(int(uptime.group(1)))


def test_what_changed_names_new_and_busy_groups_the_recent_rate_alerts_and_the_broker(
    client, viewer, time_machine
):
    from recovery.models import AlertRule

    time_machine.move_to("2026-11-26 03:40:00+00:00", tick=False)
    now = timezone.now()
    for minutes in (5, 10, 20, 30):  # a group new this hour, growing
        make_message(
            group_key="g-new",
            group_label="payments · rejected · CardDeclined",
            collected_at=now - datetime.timedelta(minutes=minutes),
        )
    for hours in (1, 2, 3, 1):  # an older group, quiet this hour
        make_message(
            group_key="g-old",
            group_label="orders · expired",
            collected_at=now - datetime.timedelta(hours=hours, minutes=1),
        )
    AlertRule.objects.create(name="open payments", kind="open_messages", state="firing")
    client.force_login(viewer)
    html = client.get("/").content.decode()
    panel = html[html.index('id="what-changed"') : html.index('<div class="cards">')]
    new = panel[panel.index('id="new-groups"') :].split("</table>")[0]
    busy = panel[panel.index('id="busy-groups"') :].split("</table>")[0]
    assert "payments · rejected · CardDeclined" in new and "orders · expired" not in new
    assert "<svg" in new  # its sparkline
    assert 'CardDeclined</a> <span class="badge bad">growing</span>' in busy
    assert "orders · expired</a></td>" in busy  # busy last hour, not growing
    assert "<strong>2</strong> collected in the last 15 min" in panel
    assert "<strong>4</strong> in the last hour" in panel
    assert "open payments: firing" in panel
    assert "broker losses unknown" in panel  # no tally sample: unknown, not "nothing lost"
