import os

import click
from celery import Celery
from celery.schedules import crontab

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

app = Celery("lazarus")
app.config_from_object("django.conf:settings", namespace="CELERY")
# Each domain package keeps its tasks in its own ``tasks`` module (found when the app finalizes),
# each task named by its module path (recovery/old_task_names.py keeps the names from before).
# Every beat entry's task must live in one of them (tests/test_health_and_worker.py checks it in
# a fresh interpreter).
TASK_PACKAGES = [
    "recovery.models",  # the store: folding the counts
    "recovery.retention",
    "recovery.collector",
    "recovery.replay",
    "recovery.audit",
    "recovery.search",
    "recovery.alerts",
    "recovery.broker",
]
app.autodiscover_tasks(TASK_PACKAGES)
app.conf.imports = [f"{package}.tasks" for package in TASK_PACKAGES]

app.user_options["worker"].add(
    click.Option(
        ["--collector/--no-collector"],
        default=None,
        help="Run the Lazarus collector threads in this worker (default: COLLECTOR_ENABLED).",
    )
)

from recovery.collector.bootsteps import CollectorStep  # noqa: E402

app.steps["worker"].add(CollectorStep)

app.user_options["worker"].add(
    click.Option(
        ["--trace-tap/--no-trace-tap"],
        default=None,
        help="Run the firehose tap (#48) in this worker (default: TRACE_TAP_ENABLED).",
    )
)

from recovery.broker.trace_tap import trace_tap_step  # noqa: E402

app.steps["worker"].add(trace_tap_step())


def nightly_at():
    from django.conf import settings

    hour, _, minute = settings.AUDIT_NIGHTLY_AT.partition(":")
    return crontab(hour=int(hour), minute=int(minute or 0))


def stall_sweep_seconds():
    from django.conf import settings

    return settings.REPLAY_STALL_SWEEP_SECONDS


def bindings_poll_seconds():
    from django.conf import settings

    return float(settings.AUDIT_BINDINGS_POLL_SECONDS)


def alerts_seconds(name):
    from django.conf import settings

    return float(getattr(settings, name))


def broker_tally_seconds():
    from django.conf import settings

    return float(settings.BROKER_TALLY_SECONDS)


def search_index_seconds():
    from django.conf import settings

    return settings.SEARCH_INDEX_SECONDS


app.conf.beat_schedule = {
    "retention": {
        "task": "recovery.retention.tasks.apply_retention",
        "schedule": crontab(minute=17),
    },
    "nightly-audit": {"task": "recovery.audit.tasks.nightly_audit", "schedule": nightly_at()},
    # Tell someone (recovery/alerts/): rules evaluated, then the outbox delivered; a tick not
    # started within its period is dropped, the next one covers it.
    "evaluate-alerts": {
        "task": "recovery.alerts.tasks.evaluate_alerts",
        "schedule": alerts_seconds("ALERTS_EVALUATE_SECONDS"),
        "options": {"expires": alerts_seconds("ALERTS_EVALUATE_SECONDS")},
    },
    "deliver-notifications": {
        "task": "recovery.alerts.tasks.deliver_notifications",
        "schedule": alerts_seconds("ALERTS_DELIVER_SECONDS"),
        "options": {"expires": alerts_seconds("ALERTS_DELIVER_SECONDS")},
    },
    # Who is bound to what, and since when: the audit's expected consumer groups.
    "record-bindings": {
        "task": "recovery.audit.tasks.record_bindings",
        "schedule": bindings_poll_seconds(),
        "options": {"expires": bindings_poll_seconds()},
    },
    # The broker's own count of what it dead-lettered or dropped, against the store.
    "record-broker-tally": {
        "task": "recovery.broker.tasks.record_tally",
        "schedule": broker_tally_seconds(),
        "options": {"expires": broker_tally_seconds()},
    },
    # Give-ups producers parked in the outbox while the broker was unreachable.
    "forward-client-outbox": {
        "task": "recovery.collector.tasks.forward_client_outbox",
        "schedule": 30.0,
    },
    # Replay jobs whose runner died (kill -9, lost machine) go to another worker.
    "resume-stalled-replay-jobs": {
        "task": "recovery.replay.tasks.resume_stalled_jobs",
        "schedule": stall_sweep_seconds(),
    },
    # Fold the overview's count deltas (recovery.models.MessageCount).
    "compact-message-counts": {
        "task": "recovery.models.tasks.compact_message_counts",
        "schedule": 60.0,
    },
    # Copy new messages' search documents into the trigram-indexed side table; each run stops
    # after 30 s, and a run not started within one period is dropped (the next one covers it).
    "index-new-messages": {
        "task": "recovery.search.tasks.index_new_messages",
        "schedule": search_index_seconds(),
        "options": {"expires": search_index_seconds()},
    },
    "sweep-search-index": {
        "task": "recovery.search.tasks.sweep_search_index",
        "schedule": crontab(minute=47),
    },
}
