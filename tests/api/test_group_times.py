"""The failure groups' oldest and newest times, kept with their counts (#34): the groups API pages
and sorts on them, and equals the exact answer from the messages, after status changes and
deletes too (inexact keys are probed until the compaction puts them right)."""

import datetime

import pytest
from django.db.models import Count, Max, Min, Q
from django.utils import timezone

from recovery.models import Message, MessageTotal
from tests.helpers.api import make_message

pytestmark = pytest.mark.django_db

FILTERS = [
    {},
    {"status": "pending"},
    {"queue": "q1"},
    {"kind": "unroutable"},
    {"reason": "rejected"},
]


def parse(text):
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))


def paged(api, params, page_size=3):
    """Every group through the API, page by page: [(key, count, pending, first, last)]."""
    groups, url, params = [], "/api/v1/groups", {**params, "page_size": page_size}
    while url:
        page = api.get(url, params).json()
        groups += page["results"]
        url, params = page["next"], None
    return [
        (g["key"], g["count"], g["pending"], parse(g["first_seen"]), parse(g["last_seen"]))
        for g in groups
    ]


def paged_back(api, params, page_size=3):
    """The same, from the last page back to the first through the ``previous`` links."""
    url, params = "/api/v1/groups", {**params, "page_size": page_size}
    while True:  # to the last page
        page = api.get(url, params).json()
        url, params = page["next"], None
        if url is None:
            break
    pages = [page["results"]]
    while page["previous"]:
        page = api.get(page["previous"]).json()
        pages.insert(0, page["results"])
    return [(g["key"], parse(g["last_seen"])) for results in pages for g in results]


def exact(params):
    """The same, computed from the message table, most recently seen first."""
    columns = {"status": "status", "queue": "source_queue", "kind": "kind", "reason": "reason"}
    messages = Message.objects.filter(**{columns[k]: v for k, v in params.items()})
    rows = (
        messages.order_by()
        .values("group_key")
        .annotate(
            count=Count("id"),
            pending=Count("id", filter=Q(status="pending")),
            first=Min("collected_at"),
            last=Max("collected_at"),
        )
    )
    ordered = sorted(rows, key=lambda r: (-r["last"].timestamp(), r["group_key"]))
    return [(r["group_key"], r["count"], r["pending"], r["first"], r["last"]) for r in ordered]


def kept_rows_are_all_exact():
    return not MessageTotal.objects.filter(exact=False).exists()


def a_store_of_groups():
    """12 groups over two queues and two kinds, 5 messages each at distinct times, some with
    equal newest times (ties sort by key)."""
    base = timezone.now().replace(microsecond=0) - datetime.timedelta(days=3)
    messages = []
    for g in range(12):
        for n in range(5):
            messages.append(
                make_message(
                    group_key=f"grp{g:02d}",
                    group_label=f"q{g % 2} · rejected · {g}",
                    source_queue=f"q{g % 2}",
                    kind="unroutable" if g % 3 == 0 else "dead_letter",
                    collected_at=base + datetime.timedelta(minutes=97 * n + 13 * (g % 6)),
                )
            )
    return messages


def test_paging_on_the_kept_times_equals_the_exact_answer(viewer_api):
    messages = a_store_of_groups()
    for params in FILTERS:
        assert paged(viewer_api, params) == exact(params), params
    assert kept_rows_are_all_exact()  # inserts alone never make a probe necessary

    # Status changes: messages move between keys (the oldest and newest of some groups).
    moved = [m.pk for m in messages[::4]] + [m.pk for m in messages[4::5]]
    Message.objects.filter(pk__in=moved).update(status="replayed")
    Message.objects.filter(pk__in=[m.pk for m in messages[1::7]]).update(status="discarded")
    # Deletes: the newest of groups 0-3, the oldest of groups 4-7, all of group 11.
    gone = [messages[g * 5 + 4].pk for g in range(4)] + [messages[g * 5].pk for g in range(4, 8)]
    Message.objects.filter(pk__in=gone).delete()
    Message.objects.filter(group_key="grp11").delete()

    assert not kept_rows_are_all_exact()  # messages left keys: those are probed meanwhile
    for params in FILTERS:
        assert paged(viewer_api, params) == exact(params), params
        assert paged(viewer_api, params, page_size=500) == exact(params), params
        backwards = paged_back(viewer_api, params, page_size=4)
        assert backwards == [(row[0], row[4]) for row in exact(params)], params

    MessageTotal.compact()

    assert kept_rows_are_all_exact()
    for params in FILTERS:
        assert paged(viewer_api, params) == exact(params), params


def test_a_key_a_message_left_is_inexact_until_the_compaction_corrects_it():
    """What 'oldest' and 'newest' mean after a delete: the kept times are exact while messages
    only arrive; a message leaving a key marks it inexact (its times are then only bounds), and
    the compaction reads the key's true oldest and newest from the messages."""
    t0 = datetime.datetime(2026, 11, 1, 10, 0, tzinfo=datetime.UTC)
    first, middle, last = (
        make_message(group_key="k", collected_at=t0 + datetime.timedelta(hours=h))
        for h in (0, 5, 9)
    )

    def kept(status="pending"):
        rows = MessageTotal.objects.filter(group_key="k", status=status)
        return rows.aggregate(first=Min("first_at"), last=Max("last_at"), n=Count("id"))

    assert kept() == {"first": t0, "last": last.collected_at, "n": 3}  # three delta rows
    assert kept_rows_are_all_exact()

    Message.objects.filter(pk=last.pk).update(status="replayed")
    Message.objects.filter(pk=first.pk).delete()
    Message.objects.filter(pk=middle.pk).update(status_reason="noted")  # no counted column

    replayed = kept("replayed")
    assert (replayed["first"], replayed["last"]) == (last.collected_at, last.collected_at)
    assert MessageTotal.objects.filter(group_key="k", status="pending", exact=False).count() == 2
    assert kept()["first"] == t0  # a bound now: no newer than the true oldest

    MessageTotal.compact()

    pending = MessageTotal.objects.get(group_key="k", status="pending")
    assert (pending.n, pending.exact) == (1, True)
    assert (pending.first_at, pending.last_at) == (middle.collected_at, middle.collected_at)
    assert pending.first_hour == t0  # the group is not new: its first hour stays
    assert MessageTotal.objects.get(group_key="k", status="replayed").exact

    Message.objects.filter(pk=middle.pk).delete()
    MessageTotal.compact()
    assert not MessageTotal.objects.filter(group_key="k", status="pending").exists()


def test_rebuild_keeps_the_exact_times():
    a_store_of_groups()
    MessageTotal.objects.all().delete()
    MessageTotal.rebuild()
    assert kept_rows_are_all_exact()
    for g in ("grp00", "grp05"):
        kept = MessageTotal.objects.filter(group_key=g).aggregate(
            first=Min("first_at"), last=Max("last_at")
        )
        truth = Message.objects.filter(group_key=g).aggregate(
            first=Min("collected_at"), last=Max("collected_at")
        )
        assert kept == truth


def test_the_console_sorts_most_recent_groups_on_the_kept_times(client, viewer):
    messages = a_store_of_groups()
    Message.objects.filter(pk__in=[messages[g * 5 + 4].pk for g in range(0, 12, 2)]).delete()
    MessageTotal.compact()
    client.force_login(viewer)

    groups = client.get("/groups/", {"sort": "recent"}).context["groups"]

    truth = exact({})
    assert [g["group_key"] for g in groups] == [row[0] for row in truth]
    assert [(g["first"], g["last"]) for g in groups] == [(row[3], row[4]) for row in truth]


def test_groups_of_a_time_window_count_exactly_after_deletes_in_folded_days(viewer_api):
    """since/until on the hour read the hourly rollup: a delete's delta row keeps its message's
    hour while the compaction folded older hours into their day, so an hour can sum below zero
    until the next compaction; the group's count is still the sum of all its hours."""
    from recovery.models import MessageCount

    midnight = timezone.now().astimezone(datetime.UTC).replace(
        hour=0, minute=0, second=0, microsecond=0
    ) - datetime.timedelta(days=4)
    messages = [
        make_message(
            group_key="old", collected_at=midnight + datetime.timedelta(hours=h, minutes=7)
        )
        for h in (1, 2, 3, 30)
    ]
    MessageCount.compact()  # folds those hours into their days
    Message.objects.filter(pk__in=[messages[1].pk, messages[3].pk]).delete()

    # A midnight: the rollup answers; an hour inside a folded day: the messages do. Both exact.
    for since in (midnight, midnight + datetime.timedelta(hours=1)):
        [group] = viewer_api.get("/api/v1/groups", {"since": since.isoformat()}).json()["results"]
        assert group["count"] == 2, since
        assert parse(group["first_seen"]) == messages[0].collected_at
        assert parse(group["last_seen"]) == messages[2].collected_at
        stats = viewer_api.get("/api/v1/stats", {"since": since.isoformat()}).json()
        assert stats["total"] == 2, since


def test_a_cursor_naming_a_time_out_of_range_is_a_404(viewer_api):
    from rest_framework.pagination import Cursor, CursorPagination

    make_message(group_key="f")
    pagination = CursorPagination()
    pagination.base_url = "http://testserver/api/v1/groups"
    for position in ('[-99999999999999999999, "x"]', '[99999999999999999999, "x"]'):
        for reverse in (False, True):
            cursor = Cursor(offset=0, reverse=reverse, position=position)
            assert viewer_api.get(pagination.encode_cursor(cursor)).status_code == 404
