"""The audit's metric names are said once on each side of the layer line: spark/metrics.py (the
job) and recovery/models/audit.py (the API, the loader and the console). recovery/ may not
import spark/, so this test is what keeps the two the same. It imports the module, never
starts Spark: it runs in the quick loop."""

from recovery.models import audit as django_side
from spark import metrics as job

NAMES = (
    "COUNT_METRICS",
    "LATENCY_METRICS",
    "RATIO_METRICS",
    "METRICS",
    "FINAL_ONLY",
    "WARNING_METRICS",
    "WINDOW_KEYS",
)


def test_the_django_side_names_the_metrics_the_job_writes():
    assert {name: getattr(django_side, name) for name in NAMES} == {
        name: getattr(job, name) for name in NAMES
    }


def test_the_api_names_the_metrics_operators_read():
    for name in ("distinct_published", "publish_attempts", "lost", "dup_msgs", "input_gaps"):
        assert name in django_side.METRICS
