"""Paging anchors of another team's rows (#46): ``?before=<A's id>`` gives team B exactly what
an id no row has gives (the first page), on every keyset page, or the page would say whether
that id exists and when it was made.

B's rows are older and newer than each of A's anchors, so an anchor read unscoped would cut
B's page at A's row's time: the newer of B's rows would be missing.
"""

import datetime
import inspect
import re

import pytest
from django.test import Client
from django.urls import resolve
from django.utils import timezone

from recovery.models import Activity, Membership, MessageHistory, ReplayJob, Team, TeamScope
from tests.helpers import make_message, make_user
from tests.helpers.teams import console_urls

pytestmark = pytest.mark.django_db

NO_SUCH_ID = 9_000_000_001
B_GROUP = "b" * 40
# What differs between two renders of one page: the CSRF token, masked anew each time.
VOLATILE = re.compile(rb'(name="csrfmiddlewaretoken" value=|csrf[-_]?token"?[:=] ?)"[^"]*"', re.I)


def _team(name, pattern):
    team = Team.objects.create(name=name)
    TeamScope.objects.create(team=team, vhost="/", queue_pattern=pattern)
    user = make_user(f"{name}-operator", None)
    Membership.objects.create(user=user, team=team, role="operator")
    return team, user


def _rows(team, user, queue, at, group_key):
    """One message, job, activity row and history row of ``team``, all made at ``at``."""
    message = make_message(source_queue=queue, group_key=group_key, collected_at=at)
    job = ReplayJob.objects.create(
        created_by=user, team=team, message_ids=[message.pk], state="done", total=1
    )
    ReplayJob.objects.filter(pk=job.pk).update(created_at=at)
    activity = Activity.objects.create(
        user=user, action="discard", message=message, job=job, created_at=at
    )
    history = MessageHistory.objects.create(
        message_id=message.message_id,
        store_id=message.pk,
        vhost="/",
        queue=queue,
        group_key=group_key,
        action="discard",
        who=user.username,
        at=at,
    )
    return {"messages": message, "jobs": job, "activity": activity, "history": history}


@pytest.fixture
def anchors():
    now = timezone.now()
    team_b, b_user = _team("search", "search.*")
    team_a, a_user = _team("payments", "payments.*")
    for minutes in (30, 10):  # B's rows on either side of A's
        _rows(team_b, b_user, "search.index", now - datetime.timedelta(minutes=minutes), B_GROUP)
    a_rows = _rows(team_a, a_user, "payments.cards", now - datetime.timedelta(minutes=20), "a" * 40)
    return b_user, a_rows


PAGES = {
    "messages": "/messages/",
    "jobs": "/jobs/",
    "activity": "/activity/",
    "history": "/history/",
    "group": f"/groups/{B_GROUP}/",
}


@pytest.mark.parametrize("page", sorted(PAGES))
def test_it_pages_from_another_teams_anchor_as_from_an_id_no_row_has(anchors, page):
    b_user, a_rows = anchors
    # The group's page pages messages.
    a_id = a_rows["messages" if page == "group" else page].pk
    client = Client()
    client.force_login(b_user)
    path = PAGES[page]
    absent = client.get(path, {"before": NO_SUCH_ID})
    of_a = client.get(path, {"before": a_id})
    assert (of_a.status_code, absent.status_code) == (200, 200)
    assert _normal(of_a.content, a_id) == _normal(absent.content, NO_SUCH_ID)


def _normal(content, anchor):
    """A page without what differs between two renders: the CSRF token (masked anew each time)
    and the anchor itself where the page links back to the URL it was asked with."""
    content = VOLATILE.sub(b"", content)
    return re.sub(
        rb"before(=|%3D)" + str(anchor).encode() + rb"(?!\d)", rb"before\1ANCHOR", content
    )


def test_it_still_pages_from_an_anchor_of_the_callers_own(anchors):
    b_user, _a_rows = anchors
    client = Client()
    client.force_login(b_user)
    newer, older = ReplayJob.objects.filter(team__name="search").order_by("-created_at")
    page = client.get("/jobs/", {"before": newer.pk})
    assert page.status_code == 200
    assert f"/jobs/{older.pk}/" in page.content.decode()
    assert f"/jobs/{newer.pk}/" not in page.content.decode()


# Keyset pages whose rows are every team's: a day's audit run (each team sees its own windows
# of it), and a run's evidence, paged with ``after`` as a filter (no row is looked up).
SHARED_ROWS = {"audit_list", "audit_evidence"}


def test_it_covers_every_keyset_page():
    """A page added later that reads an anchor (``anchor_of``) is one PAGES above names."""
    covered = {resolve(path).func.__name__ for path in PAGES.values()}
    paging = {
        resolve("/" + url).func.__name__
        for url in console_urls()
        if "anchor_of(" in inspect.getsource(resolve("/" + url).func)
    }
    assert paging - SHARED_ROWS == covered
