"""Health endpoints: /livez (the process answers), /readyz (it can serve), /healthz (details).

Every caller, anonymous, a team's member, any API token, gets up or down per dependency and
nothing else: the collector's detail (worker hosts and pids, queue names and depths, last
errors, which can quote any team's row) and /readyz's error texts and unapplied-migration
count are told only to a global admin (logged in, or by an admin's token acting as itself)
and to MONITORING_TOKEN (docs/security.md, "Metrics and health").
"""

from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.http import HttpResponse, JsonResponse
from django.views.decorators.http import require_GET

from recovery.access.tokens import caller_scope, is_monitoring
from recovery.broker.connection import connect
from recovery.collector.health import collector_health
from recovery.models import Role, team_scoped
from recovery.search import index as search_index

PROBE_TIMEOUT_S = 3


def _database_ok():
    try:
        with connection.cursor() as cur:
            cur.execute("SELECT 1")
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        return {"ok": False, "error": str(exc)}
    return {"ok": True}


def _may_see_details(request):
    if is_monitoring(request):
        return True
    scope = caller_scope(request)
    return scope is not None and scope.is_global and scope.has_role(Role.ADMIN)


@team_scoped  # up or down only, unless the caller may see every team's detail
@require_GET
def healthz(request):
    report = {"database": _database_ok(), "broker": {"ok": True}}
    report["collector"] = collector_health(database_ok=report["database"]["ok"])
    report["broker"] = report["collector"].pop("broker")
    ok = report["database"]["ok"] and report["broker"]["ok"]
    if not _may_see_details(request):
        return JsonResponse(
            {
                "ok": ok,
                "database": {"ok": report["database"]["ok"]},
                "broker": {"ok": report["broker"]["ok"]},
                "detail": "The details are for global admins and MONITORING_TOKEN.",
            },
            status=200 if ok else 503,
        )
    if report["database"]["ok"]:
        # Messages stored but not yet in the search table (searches still find them, slower).
        report["search_index"] = {"unindexed": search_index.unindexed_count()}
    return JsonResponse(report, status=200 if ok else 503)


@team_scoped  # up or down only: nothing of any team's
@require_GET
def livez(request):
    """Liveness: the process answers requests. Touches neither the database nor the broker."""
    return JsonResponse({"ok": True})


@team_scoped
@require_GET
def readyz(request):
    """Readiness: the database answers with every migration applied, and the broker accepts a
    connection. 503 names the check that failed; only a global admin or MONITORING_TOKEN is
    told more than up or down (the error text, how many migrations are unapplied)."""
    checks = {"database": _database_ok()}
    if checks["database"]["ok"]:
        try:
            executor = MigrationExecutor(connection)
            unapplied = executor.migration_plan(executor.loader.graph.leaf_nodes())
        except Exception as exc:  # noqa: BLE001 - reported, not raised
            checks["migrations"] = {"ok": False, "error": str(exc)}
        else:
            checks["migrations"] = {"ok": not unapplied, "unapplied": len(unapplied)}
    try:
        connect(socket_timeout=PROBE_TIMEOUT_S, stack_timeout=PROBE_TIMEOUT_S).close()
        checks["broker"] = {"ok": True}
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        checks["broker"] = {"ok": False, "error": type(exc).__name__}
    ok = all(check["ok"] for check in checks.values())
    if not _may_see_details(request):
        # A database error names hosts and users; the migration count dates the deployment.
        checks = {name: {"ok": check["ok"]} for name, check in checks.items()}
    return JsonResponse({"ok": ok, **checks}, status=200 if ok else 503)


@team_scoped
def favicon(request):
    return HttpResponse(status=204)
