"""groups (failure groups with counts and first/last seen) and stats (counts, collector lag)."""

import datetime

import pytest
from django.utils import timezone

from tests.api.conftest import make_message
from tests.conftest import make_user


@pytest.fixture
def viewer_api(api_as, db):
    return api_as(make_user("v", "viewer"))


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
