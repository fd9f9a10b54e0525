from celery import shared_task

from recovery.old_task_names import formerly


@shared_task(name="recovery.alerts.tasks.evaluate_alerts")
@formerly("recovery.alert_tasks.evaluate_alerts")
def evaluate_alerts():
    """Evaluate every enabled alert rule; returns {rule id: event} of the rules that notified."""
    from recovery.alerts.engine import evaluate

    return {str(k): v for k, v in evaluate().items() if v}


@shared_task(name="recovery.alerts.tasks.deliver_notifications")
@formerly("recovery.alert_tasks.deliver_notifications")
def deliver_notifications():
    """Deliver the notifications that are due; returns {delivered, failed}."""
    from recovery.alerts.deliver import deliver_due

    return deliver_due()
