"""The Celery task names from before every task was named by its module path (issue #27).

A task message carries its task's name, and so does each entry of a running Celery beat: task
messages still queued when the new release starts, and a beat not yet restarted, send the old
names. ``formerly`` registers the old name as a second task running the same function with the
same options, so those messages still run. The list is in docs/decisions.md.

Remove this module and every ``@formerly`` in the release after the one that renamed the tasks:
by then no queue holds a message the previous release sent.
"""

from celery import shared_task

# Old name -> the name the task has now; filled as the task modules load.
OLD_NAMES = {}


def formerly(old_name, **options):
    """Decorate a task function (below its ``@shared_task``, with the same options) to keep
    ``old_name`` working: the function itself is returned unchanged."""

    def register(function):
        OLD_NAMES[old_name] = f"{function.__module__}.{function.__name__}"
        shared_task(name=old_name, **options)(function)
        return function

    return register
