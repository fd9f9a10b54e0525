"""``simulate --telemetry mixed`` (#47): half the publishers and groups describe what they do as
OpenTelemetry spans sent to the real intake (a live server), the others write the log contract;
the audit of the day reads both, each publish once, the span-described ones as ``sent``."""

import datetime
import json

import pyarrow.dataset as ds
import pytest
from django.conf import settings

from recovery.audit.run import run_audit
from tests.simulator.helpers import read_log_lines, simulate

pytestmark = [pytest.mark.spark, pytest.mark.slow]


@pytest.mark.django_db(transaction=True)
def test_a_mixed_day_is_audited_from_logs_and_spans(live_server, collector, tmp_path):
    truth, _, paths = simulate(
        tmp_path,
        "--count",
        "60",
        "--seed",
        "otel-mixed",
        "--reject",
        "0.1",
        "--telemetry",
        "mixed",
        "--otlp-endpoint",
        live_server.url + "/v1/traces",
    )
    telemetry = truth["telemetry"]
    assert telemetry["mode"] == "mixed" and telemetry["span_producers"] == ["simulate-1"]
    assert telemetry["spans_sent"] > 0 and telemetry["spans_dropped"] == 0
    span_groups = set(telemetry["span_groups"])
    all_groups = {b["consumer_group"] for b in truth["bindings"]}
    assert span_groups and span_groups < all_groups  # some groups on each side

    # The log side: only the log producers' lines and the log groups' lines.
    produced = read_log_lines(paths["logs"] / "producer")
    assert produced and {line["producer"] for _, line in produced} == {"simulate-0"}
    consumed = read_log_lines(paths["logs"] / "consumer")
    log_groups = {line["consumer_group"] for _, line in consumed}
    # (demo.expiring's queue has no consumer: it is in neither.)
    assert log_groups and log_groups <= all_groups - span_groups
    # The span side: under AUDIT_SPANS, as the intake wrote them.
    rows = ds.dataset(settings.AUDIT_SPANS, format="parquet").to_table().to_pylist()
    assert {r["service_name"] for r in rows if r["kind"] == "producer"} == {"simulate-1"}
    assert {r["consumer_group"] for r in rows if r["kind"] == "consumer"} <= span_groups
    span_ids = {r["message_id"] for r in rows if r["kind"] == "producer"}
    log_ids = {line["message_id"] for _, line in produced}
    assert span_ids and log_ids and not span_ids & log_ids

    days = sorted(
        {datetime.date.fromisoformat(p.parent.name[3:]) for p in paths["logs"].rglob("hour=*")}
    )
    now = datetime.datetime.combine(days[-1], datetime.time(), datetime.UTC)
    totals = {}
    for day in days:
        run = run_audit(
            day,
            producer_logs=str(paths["logs"] / "producer"),
            consumer_logs=str(paths["logs"] / "consumer"),
            now=now + datetime.timedelta(days=3),
            master="local[1]",
            bindings=truth["bindings"],
        )
        assert run.status == "succeeded", run.error
        for name, value in run.totals.items():
            if isinstance(value, int):
                totals[name] = totals.get(name, 0) + value
    # Every publish once, whichever side described it; the spans' as "sent".
    assert totals["distinct_published"] == truth["totals"]["distinct_published"]
    assert totals["sent"] == len(span_ids)
    assert totals["confirmed"] + totals["nacked"] + totals["returned"] > 0
    assert (
        totals["sent"]
        + totals["confirmed"]
        + totals["nacked"]
        + totals["returned"]
        + totals["unconfirmed"]
        == totals["distinct_published"]
    ), json.dumps(totals)
