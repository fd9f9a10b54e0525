"""`manage.py audit` end to end: store export -> spark-submit (local) -> results in PostgreSQL."""

import datetime
import io
import json
import os

import pytest
from django.core.management import call_command

from recovery.audit.export import export_store
from recovery.models import AuditEvidence, AuditRun, Message
from tests.helpers.audit import BINDINGS, DAY, consumed, produced, write_log

pytestmark = [pytest.mark.spark, pytest.mark.slow]


@pytest.fixture
def logs(tmp_path):
    write_log(
        tmp_path,
        "producer",
        10,
        "shop-api-host-1",
        [
            produced("ok-1"),
            produced("retry-1", attempt=1, outcome="timeout"),
            produced("retry-1", attempt=2, outcome="ack", dt=10),
            produced("dead-1"),
            produced("lost-1"),
            '{"ts": "not a number", this is not json',
        ],
    )
    write_log(
        tmp_path,
        "consumer",
        10,
        "billing-host-1",
        [
            consumed("ok-1"),
            consumed("retry-1"),
            consumed("retry-1", dt=60),
        ],
    )
    return tmp_path


@pytest.mark.django_db(transaction=True)
def test_it_audits_a_day_and_keeps_revisions(logs):
    Message.objects.create(
        kind="dead_letter",
        reason="rejected",
        source_queue="billing.orders",
        source_exchange="shop",
        routing_keys=["order.created"],
        message_id="dead-1",
        body=b"",
        body_size=0,
        fingerprint="fp-dead-1",
        group_key="g",
        collected_at=datetime.datetime(2026, 11, 20, 10, 0, 1, tzinfo=datetime.UTC),
    )
    (logs / "bindings.json").write_text(json.dumps(BINDINGS))
    args = [
        "--date",
        DAY.isoformat(),
        "--producer-logs",
        str(logs / "producer"),
        "--consumer-logs",
        str(logs / "consumer"),
        "--now",
        "2026-11-22T00:00:00",
        "--master",
        "local[1]",
    ]
    from django.conf import settings

    settings.AUDIT_BINDINGS = str(logs / "bindings.json")
    try:
        out = io.StringIO()
        call_command("audit", *args, stdout=out)
        call_command("audit", *args, stdout=io.StringIO())
    finally:
        settings.AUDIT_BINDINGS = ""

    first, second = AuditRun.objects.filter(date=DAY).order_by("revision")
    assert (first.revision, second.revision) == (1, 2)
    assert first.status == second.status == "succeeded"
    assert first.finality == "FINAL"
    totals = first.totals
    assert totals["distinct_published"] == 4
    assert totals["publish_attempts"] == 5
    assert totals["producer_retries"] == 1
    assert totals["delivered_unique"] == 2
    assert totals["dead_lettered"] == 1
    assert totals["lost"] == 1
    assert totals["malformed_lines"] == 1
    assert totals["dup_msgs"] == 1
    assert first.windows.filter(consumer_group="billing").exists()
    lost = AuditEvidence.objects.get(run=first, kind="lost")
    assert lost.message_id == "lost-1"
    assert AuditEvidence.objects.filter(run=first, kind="duplicate", message_id="retry-1").exists()
    assert first.manifest["files"] and first.code_version
    assert "lost=1" in out.getvalue()


def audit_without_logs(tmp_path, master):
    from recovery.audit.run import run_audit

    return run_audit(
        DAY,
        producer_logs=str(tmp_path / "p"),
        consumer_logs=str(tmp_path / "c"),
        master=master,
        bindings=[],
    )


@pytest.mark.django_db(transaction=True)
def test_a_failed_spark_run_is_recorded_not_hidden(tmp_path):
    run = audit_without_logs(tmp_path, "no-such-master://x")
    assert run.status == "failed"
    assert "spark-submit failed" in run.error


@pytest.mark.django_db(transaction=True)
def test_a_failed_audit_job_records_its_own_error_not_only_sparks_shutdown(tmp_path):
    """spark-submit puts the Python job's traceback on its stdout; the run's error keeps it."""
    hour = tmp_path / "p" / f"dt={DAY}" / "hour=03"
    hour.mkdir(parents=True)
    (hour / "part-0.parquet").write_bytes(b"not parquet at all")
    run = audit_without_logs(tmp_path, "local[1]")
    assert run.status == "failed"
    assert "Traceback (most recent call last)" in run.error
    assert "part-0.parquet" in run.error
    assert "--- the end of spark-submit's log:" in run.error


@pytest.mark.django_db(transaction=True)
def test_the_store_export_is_the_contract_spark_reads(tmp_path):
    import pyarrow.parquet as pq

    Message.objects.create(
        kind="unroutable",
        reason="no_route",
        source_exchange="shop",
        routing_keys=["x.y"],
        message_id="",
        body=b"",
        body_size=0,
        fingerprint="fp-u",
        group_key="g",
        collected_at=datetime.datetime(2026, 11, 20, 23, 59, tzinfo=datetime.UTC),
    )
    path = tmp_path / "store.parquet"
    assert export_store(DAY, datetime.timedelta(hours=1), path) == 1
    [row] = pq.read_table(path).to_pylist()
    assert row["routing_key"] == "x.y" and row["message_id"] is None


@pytest.mark.django_db(transaction=True)
def test_an_exchange_the_broker_does_not_know_is_audited_from_what_its_consumers_did(tmp_path):
    """Issue #16's report: a day of "payments", an exchange with no binding on the broker
    Lazarus watches, one group consuming all but 3. Not a quiet success: the 3 are lost (expected
    by observation), and the run says what it could not see."""
    from recovery.audit.run import run_audit

    sent = [
        {**produced(f"p{i}", dt=i * 1000), "exchange": "payments", "routing_key": "settled"}
        for i in range(60)
    ]
    missed = {"p7", "p30", "p31"}
    write_log(tmp_path, "producer", 10, "payments-api", sent)
    write_log(
        tmp_path,
        "consumer",
        10,
        "ledger-1",
        [
            {**consumed(p["message_id"], dt=i * 1000 + 40), "consumer_group": "ledger"}
            for i, p in enumerate(sent)
            if p["message_id"] not in missed
        ],
    )
    # A vhost of its own with no application bindings (the session's vhost has other tests').
    from django.conf import settings

    from recovery.broker.management import Management

    management, vhost = Management(), f"lazarus-test-nobindings-{os.getpid()}"
    management.put_vhost(vhost)
    management.grant(vhost, "guest")
    original, settings.RECOVERY_VHOSTS = settings.RECOVERY_VHOSTS, [vhost]
    try:
        run = run_audit(
            DAY,
            producer_logs=str(tmp_path / "producer"),
            consumer_logs=str(tmp_path / "consumer"),
            now=datetime.datetime(2026, 11, 22, tzinfo=datetime.UTC),
            master="local[1]",
        )
    finally:
        settings.RECOVERY_VHOSTS = original
        management.delete_vhost(vhost)
    assert run.status == "succeeded", run.error
    assert run.outcome == "succeeded_with_warnings"
    codes = {w["code"]: w["count"] for w in run.warnings}
    # That vhost has no application bindings at all: that too is said.
    assert codes == {"bindings_snapshot_only": 1, "no_bindings": 1, "unbound_consumption": 57}
    assert (run.totals["lost"], run.totals["expected_confirmed"]) == (3, 60)
    lost = AuditEvidence.objects.filter(run=run, kind="lost")
    assert sorted((e.message_id, e.consumer_group, e.cause) for e in lost) == [
        (m, "ledger", "observed") for m in sorted(missed)
    ]
    assert run.config["expected_by"] == {"observed": 1}
    assert run.config["observed"][0]["consumer_group"] == "ledger"


def test_outputs_a_cluster_wrote_where_this_machine_cannot_read_fail_the_run(tmp_path):
    """Executors on other machines writing to a directory that is not shared leave their parts on
    their own disks: fewer rows here than the job counted is an error, never a smaller result."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from recovery.audit.results import check_outputs
    from recovery.errors import AuditError

    (tmp_path / "lost").mkdir()
    pq.write_table(pa.table({"message_id": ["a", "b"]}), tmp_path / "lost" / "part-0.parquet")
    (tmp_path / "rows.json").write_text(json.dumps({"lost": 2, "windows": 0}))
    check_outputs(tmp_path)  # all there (an empty output may have no folder at all)

    (tmp_path / "rows.json").write_text(json.dumps({"lost": 5, "windows": 0}))
    with pytest.raises(AuditError, match=r"lost: 2 of 5 rows.*AUDIT_WORK_DIR"):
        check_outputs(tmp_path)
    (tmp_path / "rows.json").unlink()
    with pytest.raises(AuditError, match="rows.json"):
        check_outputs(tmp_path)
