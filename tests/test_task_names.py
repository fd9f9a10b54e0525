"""Every Celery task is named by its module path; the names from before run the same function
for one release (recovery/old_task_names.py), and docs/decisions.md lists them.

That an old-name message really runs in a worker: tests/replay/test_tasks.py."""

import re
from pathlib import Path

from console.celery import app
from recovery.old_task_names import OLD_NAMES

DECISIONS = Path(__file__).resolve().parent.parent / "docs" / "decisions.md"


def registered():
    """The app's tasks once a worker's modules are imported, Celery's own left out."""
    app.loader.import_default_modules()
    return {name: task for name, task in app.tasks.items() if not name.startswith("celery.")}


def module_path(task):
    return f"{task.run.__module__}.{task.run.__name__}"


def test_it_names_every_task_by_its_module_path():
    tasks = registered()
    wrong = {name: module_path(task) for name, task in tasks.items() if name not in OLD_NAMES}
    assert {name: path for name, path in wrong.items() if name != path} == {}
    assert "recovery.replay.tasks.run_replay_job" in tasks


def test_it_runs_the_renamed_task_with_its_options_under_each_old_name():
    tasks = registered()
    assert OLD_NAMES
    for old, new in OLD_NAMES.items():
        assert tasks[old].run is tasks[new].run, old
        assert tasks[old].acks_late == tasks[new].acks_late, old
        assert tasks[old].ignore_result == tasks[new].ignore_result, old


def test_it_lists_the_old_names_in_the_decisions():
    text = DECISIONS.read_text()
    listed = dict(re.findall(r"^ *\| `(recovery\.[\w.]+)` \| `(recovery\.[\w.]+)` \|$", text, re.M))
    registered()  # OLD_NAMES fills as the task modules load
    assert listed == OLD_NAMES
