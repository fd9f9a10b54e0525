"""Every query a web request makes is bounded (docs/security.md, "Query budget").

A viewer's ``stats?q=``, ``groups?q=``, an export's search, a dry run or a discard count over a
large store could run for many seconds, and kept running in PostgreSQL after the client left:
a few such requests held every web worker. So each request runs its queries under PostgreSQL's
``statement_timeout`` (REQUEST_STATEMENT_TIMEOUT_MS), and a statement it cancels answers 503
"too slow, narrow your filter" (the API: a problem with code ``query_too_slow``), never a 500.

How the budget is set depends on the route to the database (settings DATABASE_POOLED):

- Direct: a session setting, set just before the request's first statement (a request that
  queries nothing pays nothing; the first statement is the session's or the user's lookup,
  outside any transaction, so no rollback undoes it) and put back when the response is done
  (for a streamed export: when the stream ends or is closed). One statement each way.
- Through a transaction-mode pooler (PgBouncer), a session setting would stay on a server
  connection other clients share. Each statement instead runs with ``SET LOCAL``
  (``set_config(..., true)``): inside a transaction, just before it (a savepoint rolled back
  may have undone an earlier one); outside, in a transaction of its own around it.

A statement is bounded, not a request: a page of ten queries may take ten budgets. Views that
need less set their own, smaller limit inside (``recovery.search.filters.planner_settings``).
"""

import threading

import psycopg
from django.conf import settings
from django.db import DatabaseError, OperationalError, connection, transaction
from django.http import HttpResponse, JsonResponse
from psycopg import errors as pg_errors
from rest_framework.exceptions import APIException

from recovery import db

DETAIL = (
    "This query took longer than {seconds:g} s and was stopped: narrow your filter (a queue, a "
    "time range, a longer or rarer search term) and try again."
)


class QueryTooSlow(OperationalError, APIException):
    """A statement cancelled by the request's budget. An OperationalError still (views that
    catch one to say "narrow your search" keep doing so), and an APIException the API's
    handler answers as a 503 problem."""

    status_code = 503
    default_code = "query_too_slow"

    def __init__(self):
        APIException.__init__(self, budget_detail(), self.default_code)


def budget_ms():
    return settings.REQUEST_STATEMENT_TIMEOUT_MS


def budget_detail():
    return DETAIL.format(seconds=budget_ms() / 1000)


_local = threading.local()


# Transaction control runs at once, and after an error (ROLLBACK TO SAVEPOINT) nothing else
# may run before it: these statements get no budget of their own.
_CONTROL = ("SAVEPOINT", "RELEASE", "ROLLBACK", "COMMIT")
_LOWER_LOCAL_BUDGET = (
    "SELECT set_config('statement_timeout', %s, true) FROM pg_settings "
    "WHERE name = 'statement_timeout' AND (setting::int = 0 OR setting::int > %s)"
)


def _set_local_budget(conn, sql):
    raw = conn.connection
    if raw.info.transaction_status == psycopg.pq.TransactionStatus.INERROR:
        return
    if isinstance(sql, str) and sql.lstrip()[:9].upper().startswith(_CONTROL):
        return
    # On psycopg's connection itself: no execute wrapper runs for this statement. Only ever
    # lowers the limit: a view's own, smaller one (planner_settings) stays in force.
    raw.execute(_LOWER_LOCAL_BUDGET, [f"{budget_ms()}ms", budget_ms()])


def _bounded(execute, sql, params, many, context):
    """The execute wrapper: the request's session budget set before its first statement (direct
    route), the budget per statement behind a pooler, and a cancelled statement raised as
    QueryTooSlow."""
    conn = context["connection"]
    try:
        if getattr(_local, "inner", False):
            return execute(sql, params, many, context)
        if db.session_state_allowed():
            budget = getattr(_local, "budget", None)
            if budget is not None and not budget.started:
                budget.start(conn)
            return execute(sql, params, many, context)
        _local.inner = True
        try:
            if conn.in_atomic_block:
                _set_local_budget(conn, sql)
                return execute(sql, params, many, context)
            with transaction.atomic(using=conn.alias):
                _set_local_budget(conn, sql)
                return execute(sql, params, many, context)
        finally:
            _local.inner = False
    except OperationalError as exc:
        if isinstance(exc.__cause__, pg_errors.QueryCanceled) and not isinstance(exc, QueryTooSlow):
            raise QueryTooSlow() from exc
        raise


class Budget:
    """The session budget of one request (direct route only): set just before the request's
    first statement (``start``, from the execute wrapper), put back by ``stop`` (idempotent)."""

    def __init__(self):
        self.previous = None
        self.started = False

    def start(self, conn):
        self.started = True
        try:
            # On psycopg's connection itself: no execute wrapper runs for this statement.
            row = conn.connection.execute(
                "SELECT current_setting('statement_timeout'), "
                "set_config('statement_timeout', %s, false)",
                [f"{budget_ms()}ms"],
            ).fetchone()
            self.previous = row[0]
        except psycopg.Error:
            # The database is down: the statement itself fails and says so.
            self.previous = None

    def stop(self):
        if self.previous is None:
            return
        previous, self.previous = self.previous, None
        try:
            with connection.cursor() as cur:
                cur.execute("SELECT set_config('statement_timeout', %s, false)", [previous])
        except DatabaseError:
            connection.close()  # not reused with the budget still set


class _BudgetedStream:
    """A streamed response's content (an export), read after the view returned: read under
    the budget; closing it (the server does, whether the client read it all or left) ends
    the request's budget."""

    def __init__(self, content, budget):
        self.content, self.budget = content, budget

    def __iter__(self):
        _local.budget = self.budget
        try:
            with connection.execute_wrapper(_bounded):
                yield from self.content
        finally:
            _local.budget = None

    def close(self):
        try:
            close = getattr(self.content, "close", None)
            if close is not None:
                close()
        finally:
            self.budget.stop()


class QueryBudgetMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if not budget_ms():
            return self.get_response(request)
        budget = _local.budget = Budget()
        try:
            with connection.execute_wrapper(_bounded):
                response = self.get_response(request)
        except BaseException:
            budget.stop()
            raise
        finally:
            _local.budget = None
        if response.streaming:
            # The stream is read after this returns: the budget lasts until it is closed.
            response.streaming_content = _BudgetedStream(response.streaming_content, budget)
        else:
            budget.stop()
        return response

    def process_exception(self, request, exception):
        if not isinstance(exception, QueryTooSlow):
            return None
        if request.path.startswith("/api/"):
            from recovery.api.errors import PROBLEM_CONTENT_TYPE, problem

            body = problem(503, budget_detail(), QueryTooSlow.default_code, request.path)
            return JsonResponse(body, status=503, content_type=PROBLEM_CONTENT_TYPE)
        return HttpResponse(
            f"<!doctype html><title>Query too slow</title><h1>Query too slow</h1>"
            f"<p>{budget_detail()}</p>",
            status=503,
            content_type="text/html; charset=utf-8",
        )
