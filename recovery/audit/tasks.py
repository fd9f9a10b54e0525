import datetime

from celery import shared_task

from recovery.old_task_names import formerly


@shared_task(name="recovery.audit.tasks.nightly_audit")
@formerly("recovery.audit_tasks.nightly_audit")
def nightly_audit(date=None):
    """Audit yesterday (UTC) unless a date (YYYY-MM-DD) is given; returns the run id."""
    # Imported here: recovery.audit.run pulls in pyarrow and numpy (~80 MB), which every worker
    # would otherwise carry, the collector's included, for a task that runs once a night.
    from recovery.audit.run import run_audit

    day = (
        datetime.date.fromisoformat(date)
        if date
        else datetime.datetime.now(datetime.UTC).date() - datetime.timedelta(days=1)
    )
    return run_audit(day).pk


@shared_task(name="recovery.audit.tasks.record_bindings")
@formerly("recovery.audit_tasks.record_bindings")
def record_bindings():
    """Poll the bindings history (recovery/audit/bindings.py); returns what changed per vhost."""
    from recovery.audit.bindings import record_bindings as poll

    return {vhost: list(change) for vhost, change in poll().items()}
