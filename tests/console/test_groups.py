"""Failure groups: counts per group from the rollup, exact first/last seen, replay links."""

import datetime

import pytest
from django.utils import timezone

from recovery.models import Message
from tests.helpers import make_message

pytestmark = pytest.mark.django_db


def test_it_lists_groups_with_counts_and_first_last_seen(client, operator):
    now = timezone.now().replace(microsecond=0)
    oldest = now - datetime.timedelta(days=2, minutes=7)
    make_message(source_queue="orders", reason="rejected", group_key="g1", collected_at=oldest)
    make_message(source_queue="orders", reason="rejected", group_key="g1", collected_at=now)
    replayed = make_message(source_queue="orders", reason="rejected", group_key="g1")
    Message.objects.filter(pk=replayed.pk).update(status="replayed")
    make_message(source_queue="pay", reason="expired", group_key="g2", group_label="pay · expired")
    client.force_login(operator)

    response = client.get("/groups/")

    groups = {g["group_key"]: g for g in response.context["groups"]}
    assert (groups["g1"]["open"], groups["g1"]["replayed"], groups["g1"]["total"]) == (2, 1, 3)
    assert groups["g1"]["first"] == oldest
    assert groups["g2"]["label"] == "pay · expired"
    assert [g["group_key"] for g in response.context["groups"]] == ["g1", "g2"]  # most open first
    html = response.content.decode()
    assert 'href="/jobs/new?group=g1"' in html
    assert 'href="/groups/g1/"' in html  # the group's own page


def test_it_filters_groups(client, viewer):
    make_message(source_queue="orders", reason="rejected", group_key="g1")
    done = make_message(source_queue="pay", reason="expired", group_key="g2")
    Message.objects.filter(pk=done.pk).update(status="discarded")
    client.force_login(viewer)

    by_queue = client.get("/groups/", {"queue": "pay"}).context["groups"]
    open_only = client.get("/groups/", {"open_only": "on"}).context["groups"]

    assert [g["group_key"] for g in by_queue] == ["g2"]
    assert [g["group_key"] for g in open_only] == ["g1"]
    assert "Replay group" not in client.get("/groups/").content.decode()  # a viewer


def test_a_group_whose_messages_are_gone_is_not_listed(client, viewer):
    message = make_message(group_key="gone")
    Message.objects.filter(pk=message.pk).delete()
    client.force_login(viewer)
    assert client.get("/groups/").context["groups"] == []


def test_each_group_shows_its_exception_a_sample_line_and_whether_it_is_new(client, viewer):
    now = timezone.now()
    make_message(
        source_queue="orders",
        group_key="g-new",
        group_label="orders · rejected · TimeoutError",
        headers={"x-exception-type": "TimeoutError"},
        body=b'{"order": 77, "sku": "A-1"}\nsecond line, not shown',
        collected_at=now - datetime.timedelta(minutes=10),
    )
    make_message(
        source_queue="billing",
        group_key="g-old",
        group_label="billing · expired",
        body=b"\x00\xff\xfe\x01 binary",
        collected_at=now - datetime.timedelta(days=2),
    )
    client.force_login(viewer)
    html = client.get("/groups/").content.decode()
    new_row = html[html.index("orders · rejected · TimeoutError") :].split("</tr>")[0]
    old_row = html[html.index("billing · expired") :].split("</tr>")[0]
    assert ">new</span>" in new_row and ">new</span>" not in old_row
    assert ">TimeoutError<" in new_row
    assert "{&quot;order&quot;: 77, &quot;sku&quot;: &quot;A-1&quot;}" in new_row
    assert "second line" not in new_row
    assert "(binary, starts 00 ff fe 01 20 62 69 6e)" in old_row


def test_each_group_shows_its_trend_over_the_last_day(client, viewer):
    now = timezone.now()
    for hours_ago, n in [(0, 3), (2, 1), (30, 5)]:  # the last is older than a day: not drawn
        for _ in range(n):
            make_message(
                group_key="g-trend", collected_at=now - datetime.timedelta(hours=hours_ago)
            )
    client.force_login(viewer)
    response = client.get("/groups/")
    [group] = response.context["groups"]
    assert len(group["trend"]) == 24
    assert group["trend"][-1] == 3 and group["trend"][-3] == 1 and sum(group["trend"]) == 4
    html = response.content.decode()
    assert 'aria-label="per hour: ' + ", ".join(map(str, group["trend"])) + '"' in html
