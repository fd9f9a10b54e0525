"""Every query a web request makes is bounded (#46 item 10; console/query_budget.py).

Real PostgreSQL: a second connection holds a lock on the store, so a real route's query waits
(a lock wait counts toward statement_timeout) until the request's budget cancels it; the route
answers 503, the backend is idle again at once, and the connection's own setting is put back.
Both routes to the database: direct (a session setting per request) and through a pooler
(``SET LOCAL`` per statement; nothing may outlive a transaction)."""

import time

import psycopg
import pytest

from recovery import db
from recovery.models import Role
from tests.helpers import make_message, make_user
from tests.helpers.api import ApiClient

pytestmark = pytest.mark.django_db(transaction=True)

BUDGET_MS = 300


@pytest.fixture
def budget(settings):
    settings.REQUEST_STATEMENT_TIMEOUT_MS = BUDGET_MS


@pytest.fixture
def store_locked():
    """The store locked by another backend until the test ends."""
    make_message(source_queue="budget.orders")
    with psycopg.connect(db.database_conninfo("budget-test-lock")) as other:
        other.execute("LOCK TABLE recovery_message IN ACCESS EXCLUSIVE MODE")
        yield other
        other.rollback()


def session_timeout():
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SHOW statement_timeout")
        return cur.fetchone()[0]


def waiting_backends():
    with psycopg.connect(db.database_conninfo("budget-test-probe")) as probe:
        return probe.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND query LIKE '%%recovery_message%%' AND datname = current_database()"
        ).fetchone()[0]


def api_get(client, path, user):
    return ApiClient(client, user).get(path)


@pytest.mark.parametrize("pooled", [False, True], ids=["direct", "pooled"])
def test_it_answers_503_when_a_request_query_runs_past_its_budget(
    client, settings, budget, store_locked, pooled
):
    settings.DATABASE_POOLED = pooled
    viewer = make_user("budget-viewer", Role.VIEWER)
    before = session_timeout()
    started = time.perf_counter()
    answer = api_get(client, "/api/v1/stats?q=orders", viewer)
    took = time.perf_counter() - started
    assert answer.status_code == 503, answer.content
    problem = answer.json()
    assert (problem["status"], problem["code"]) == (503, "query_too_slow")
    assert problem["detail"].startswith("This query took longer than 0.3 s and was stopped")
    assert took < 3
    assert waiting_backends() == 0  # cancelled in PostgreSQL, not left running
    assert session_timeout() == before


def test_it_answers_a_console_page_503_with_what_to_do(client, budget, store_locked):
    client.force_login(make_user("budget-console", Role.VIEWER))
    page = client.get("/groups/?q=orders")
    assert page.status_code == 503
    assert "narrow your filter" in page.content.decode()
    assert waiting_backends() == 0


def test_it_puts_the_session_setting_back_after_a_request(client, budget):
    viewer = make_user("budget-reset", Role.VIEWER)
    make_message(source_queue="budget.orders")
    before = session_timeout()
    assert api_get(client, "/api/v1/stats?q=orders", viewer).status_code == 200
    assert session_timeout() == before


def test_it_bounds_a_streamed_export_until_the_stream_is_closed(client, budget):
    admin = make_user("budget-export", Role.ADMIN)
    make_message(source_queue="budget.orders")
    before = session_timeout()
    answer = api_get(client, "/api/v1/messages/export?queue=budget.orders", admin)
    assert answer.status_code == 200 and answer.streaming
    assert session_timeout() == f"{BUDGET_MS}ms"  # the stream is still to be read
    lines = b"".join(answer.streaming_content).splitlines()
    assert len(lines) == 1
    answer.close()
    assert session_timeout() == before


def test_it_bounds_nothing_with_a_budget_of_zero(client, settings, store_locked):
    settings.REQUEST_STATEMENT_TIMEOUT_MS = 0
    # Without a budget the request would wait for the lock: the lock is released first.
    store_locked.rollback()
    viewer = make_user("budget-off", Role.VIEWER)
    before = session_timeout()
    assert api_get(client, "/api/v1/stats?q=orders", viewer).status_code == 200
    assert session_timeout() == before
