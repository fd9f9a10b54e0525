from django.db import connection
from django.http import HttpResponse, JsonResponse
from django.views.decorators.http import require_GET

from recovery.collector.health import collector_health
from recovery.search import index as search_index


@require_GET
def healthz(request):
    report = {"database": {"ok": True}, "broker": {"ok": True}}
    try:
        with connection.cursor() as cur:
            cur.execute("SELECT 1")
    except Exception as exc:  # noqa: BLE001 - reported, not raised
        report["database"] = {"ok": False, "error": str(exc)}
    report["collector"] = collector_health(database_ok=report["database"]["ok"])
    report["broker"] = report["collector"].pop("broker")
    if report["database"]["ok"]:
        # Messages stored but not yet in the search table (searches still find them, slower).
        report["search_index"] = {"unindexed": search_index.unindexed_count()}
    ok = report["database"]["ok"] and report["broker"]["ok"]
    return JsonResponse(report, status=200 if ok else 503)


def favicon(request):
    return HttpResponse(status=204)
