"""groups (failure groups with counts and first/last seen) and stats (counts, collector lag)."""

import datetime

from django.utils import timezone

from tests.helpers.api import make_message


def test_groups_count_and_date_their_messages(viewer_api):
    now = timezone.now()
    old = now - datetime.timedelta(hours=5)
    make_message(group_key="a", group_label="orders · rejected", collected_at=old)
    make_message(group_key="a", group_label="orders · rejected", status="replayed")
    make_message(
        group_key="b",
        source_queue="",
        source_exchange="x",
        kind="unroutable",
        reason="no_route",
        collected_at=now - datetime.timedelta(hours=1),
    )
    groups = viewer_api.get("/api/v1/groups").json()["results"]
    assert [g["key"] for g in groups] == ["a", "b"]  # most recently seen first
    a = groups[0]
    assert (a["label"], a["count"], a["pending"]) == ("orders · rejected", 2, 1)
    assert a["first_seen"] < a["last_seen"]
    b = viewer_api.get("/api/v1/groups", {"kind": "unroutable"}).json()["results"]
    assert [(g["key"], g["exchange"], g["reason"]) for g in b] == [("b", "x", "no_route")]
    pending_only = viewer_api.get("/api/v1/groups", {"status": "replayed"}).json()["results"]
    assert [(g["key"], g["count"]) for g in pending_only] == [("a", 1)]


def test_groups_page_with_a_cursor(viewer_api):
    for n in range(5):
        make_message(group_key=f"g{n}", collected_at=timezone.now() - datetime.timedelta(n))
    seen, url, params = [], "/api/v1/groups", {"page_size": 2}
    while url:
        page = viewer_api.get(url, params).json()
        seen += [g["key"] for g in page["results"]]
        url, params = page["next"], None
    assert seen == ["g0", "g1", "g2", "g3", "g4"]


def all_groups(api, params, page_size=500):
    groups, url, params = [], "/api/v1/groups", {**params, "page_size": page_size}
    while url:
        page = api.get(url, params).json()
        groups += page["results"]
        url, params = page["next"], None
    return groups


def test_groups_from_the_rollup_equal_groups_from_the_messages(viewer_api):
    """The rollup path (counts from MessageCount, times from index probes) and the GROUP BY
    over the messages answer alike, filters included."""
    hour = timezone.now().replace(minute=0, second=0, microsecond=0) - datetime.timedelta(hours=6)
    for n in range(30):
        make_message(
            group_key=f"k{n % 4}",
            group_label=f"q{n % 4 % 2} · rejected",
            source_queue=f"q{n % 4 % 2}",
            kind=["dead_letter", "unroutable"][n % 4 // 3],
            status=["pending", "replayed", "discarded", "pending", "poisoned"][n % 5],
            collected_at=hour + datetime.timedelta(minutes=17 * n),
        )
    on_the_hour = {"since": hour.isoformat()}  # the rollup answers
    inside_the_hour = {"since": (hour - datetime.timedelta(seconds=1)).isoformat()}  # messages
    for extra in ({}, {"status": "pending"}, {"queue": "q1"}, {"kind": "unroutable"}):
        from_rollup = all_groups(viewer_api, {**on_the_hour, **extra})
        assert from_rollup == all_groups(viewer_api, {**inside_the_hour, **extra}), extra
        assert from_rollup, extra
    everything = all_groups(viewer_api, {})
    assert sum(g["count"] for g in everything) == 30
    assert sum(g["pending"] for g in everything) == 12
    last_seen = [g["last_seen"] for g in everything]
    assert last_seen == sorted(last_seen, reverse=True)


def test_groups_are_dated_exactly_after_their_newest_and_oldest_messages_go(viewer_api):
    """The rollup only says which hour a group's newest/oldest message is in; deleting them
    moves the group's dates to the next message, even in another hour."""
    hour = timezone.now().replace(minute=0, second=0, microsecond=0) - datetime.timedelta(hours=5)
    times = [hour + datetime.timedelta(minutes=m) for m in (5, 50, 130, 200)]
    messages = [make_message(group_key="d", collected_at=t) for t in times]
    (group,) = all_groups(viewer_api, {})
    assert parse(group["first_seen"]) == times[0] and parse(group["last_seen"]) == times[-1]
    messages[-1].delete()
    messages[0].delete()
    (group,) = all_groups(viewer_api, {})
    assert (parse(group["first_seen"]), parse(group["last_seen"])) == (times[1], times[2])
    assert group["count"] == 2
    messages[1].delete()
    messages[2].delete()
    assert all_groups(viewer_api, {}) == []


def parse(text):
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_group_pages_go_back_and_stay_right_when_groups_arrive(viewer_api):
    now = timezone.now()
    for n in range(7):
        make_message(group_key=f"p{n}", collected_at=now - datetime.timedelta(minutes=n))
    first = viewer_api.get("/api/v1/groups", {"page_size": 3}).json()
    assert [g["key"] for g in first["results"]] == ["p0", "p1", "p2"]
    assert first["previous"] is None
    make_message(group_key="new", collected_at=now + datetime.timedelta(seconds=1))
    second = viewer_api.get(first["next"]).json()
    assert [g["key"] for g in second["results"]] == ["p3", "p4", "p5"]
    back = viewer_api.get(second["previous"]).json()
    assert [g["key"] for g in back["results"]] == ["p0", "p1", "p2"]
    assert [g["key"] for g in viewer_api.get(back["previous"]).json()["results"]] == ["new"]
    last = viewer_api.get(second["next"]).json()
    assert [g["key"] for g in last["results"]] == ["p6"] and last["next"] is None


def test_a_forged_group_cursor_is_a_404_not_a_crash(viewer_api):
    from rest_framework.pagination import Cursor, CursorPagination

    pagination = CursorPagination()
    for position in ("nonsense", '["x", 1]', "[1]", '{"a": 1}'):
        pagination.base_url = "http://testserver/api/v1/groups"
        url = pagination.encode_cursor(Cursor(offset=0, reverse=False, position=position))
        make_message(group_key="f")
        assert viewer_api.get(url).status_code == 404, position


def test_stats_count_by_kind_status_and_queue_with_the_collectors_lag(viewer_api, wired):
    make_message(source_queue="q1")
    make_message(source_queue="q1", status="replayed")
    make_message(source_queue="q2", kind="unroutable", status="discarded")
    body = viewer_api.get("/api/v1/stats").json()
    assert body["total"] == 3
    assert body["by_kind"]["dead_letter"] == 2 and body["by_kind"]["unroutable"] == 1
    assert body["by_status"] == {
        "pending": 1,
        "replaying": 0,
        "replayed": 1,
        "discarded": 1,
        "poisoned": 0,
    }
    assert body["by_queue"][0] == {"queue": "q1", "count": 2, "pending": 1}
    assert body["oldest_pending_at"] is not None
    collector = body["collector"]
    assert collector["broker"]["ok"] is True
    assert set(collector["lag"][wired]) >= {"recovery.dead_letters", "recovery.unrouted"}
    q1 = viewer_api.get("/api/v1/stats", {"queue": "q1", "status": "replayed"}).json()
    assert q1["total"] == 1 and q1["oldest_pending_at"] is None


def test_stats_from_the_rollup_equal_stats_from_the_messages(viewer_api, wired):
    hour = timezone.now().replace(minute=0, second=0, microsecond=0) - datetime.timedelta(hours=3)
    for n in range(6):
        make_message(
            source_queue=f"q{n % 2}",
            status=["pending", "replayed", "discarded"][n % 3],
            collected_at=hour + datetime.timedelta(minutes=10 * n),
        )
    make_message(collected_at=hour - datetime.timedelta(minutes=1))  # before the window
    on_the_hour = {"since": hour.isoformat()}  # the rollup answers
    inside_the_hour = {"since": (hour - datetime.timedelta(seconds=1)).isoformat()}  # messages

    def counts(params):
        body = viewer_api.get("/api/v1/stats", params).json()
        return body["total"], body["by_status"], body["by_kind"], body["by_queue"]

    assert counts(on_the_hour)[0] == 6
    assert counts(on_the_hour) == counts(inside_the_hour)
    assert counts({**on_the_hour, "queue": "q1"}) == counts({**inside_the_hour, "queue": "q1"})
