"""The bindings history (recovery/audit/bindings.py) against the real broker, and what the audit
says where it cannot see: a quiet zero is never the answer."""

import datetime

import pika
import pytest
from django.conf import settings

from recovery.audit.bindings import bindings_for_day, record_bindings
from recovery.models import AuditRun, BindingPeriod, BindingsCoverage

DAY = datetime.date(2026, 11, 20)
START = datetime.datetime(2026, 11, 20, tzinfo=datetime.UTC)


def at(hours, minutes=0):
    return START + datetime.timedelta(hours=hours, minutes=minutes)


def ms(moment):
    return int(moment.timestamp() * 1000)


@pytest.fixture
def channel(wired):
    connection = pika.BlockingConnection(pika.URLParameters(settings.RABBITMQ_URL))
    ch = connection.channel()
    ch.exchange_declare("hist.orders", "topic", auto_delete=False)
    ch.exchange_declare("hist.fan", "fanout", auto_delete=False)
    for queue in ("hist.billing", "hist.audit"):
        ch.queue_declare(queue)
        ch.queue_purge(queue)
    ch.queue_bind("hist.billing", "hist.orders", "order.*")
    yield ch
    for queue in ("hist.billing", "hist.audit"):
        ch.queue_delete(queue)
    ch.exchange_delete("hist.orders")
    ch.exchange_delete("hist.fan")
    connection.close()


def ours(entries):
    return sorted(
        (e["exchange"], e["routing_key"], e["consumer_group"], e.get("from_ms"), e.get("until_ms"))
        for e in entries
        if e["exchange"].startswith("hist.")
    )


@pytest.mark.django_db
def test_it_records_only_changes_with_when_each_binding_was_first_and_last_seen(channel):
    record_bindings(now=at(0))  # the history begins: present bindings have no first_seen
    record_bindings(now=at(0, 1))  # nothing changed: nothing written but the coverage
    assert BindingPeriod.objects.filter(exchange__startswith="hist.").count() == 1
    channel.queue_bind("hist.audit", "hist.orders", "order.created")
    channel.queue_bind("hist.audit", "hist.fan")
    record_bindings(now=at(12))  # after a pause: a new stretch of coverage
    record_bindings(now=at(12, 1))
    channel.queue_unbind("hist.billing", "hist.orders", "order.*")
    record_bindings(now=at(18, 0))
    record_bindings(now=at(18, 1))

    entries, warnings = bindings_for_day(DAY, datetime.timedelta(minutes=60))
    assert ours(entries) == [
        # fanout: every key
        ("hist.fan", "#", "hist.audit", ms(at(12)), None),
        ("hist.orders", "order.*", "hist.billing", None, ms(at(12, 1)) + 1),
        ("hist.orders", "order.created", "hist.audit", ms(at(12)), None),
    ]
    assert {e["source"] for e in entries} == {"bound"}
    stretches = BindingsCoverage.objects.filter(vhost=settings.RECOVERY_VHOSTS[0])
    assert [(c.started_at, c.polled_at) for c in stretches.order_by("started_at")] == [
        (at(0), at(0, 1)),
        (at(12), at(12, 1)),
        (at(18), at(18, 1)),
    ]
    # Seen: 00:00-00:02, 12:00-12:02, 18:00-18:02 (a poll covers one interval past it); the
    # rest of the day the history did not see, and the audit says so.
    assert warnings == [{"code": "bindings_history_gap", "count": 24 * 60 - 6}]


@pytest.mark.django_db
def test_a_binding_removed_in_a_pause_was_last_seen_before_the_pause(channel):
    record_bindings(now=at(1))
    channel.queue_unbind("hist.billing", "hist.orders", "order.*")
    record_bindings(now=at(5))
    period = BindingPeriod.objects.get(exchange="hist.orders")
    assert (period.first_seen, period.last_seen, period.gone_at) == (None, at(1), at(5))


@pytest.mark.django_db
def test_without_a_history_the_audit_uses_a_snapshot_and_says_so(channel):
    entries, warnings = bindings_for_day(DAY, datetime.timedelta(minutes=60))
    assert ours(entries) == [("hist.orders", "order.*", "hist.billing", None, None)]
    assert warnings == [{"code": "bindings_snapshot_only", "count": 1}]


@pytest.mark.django_db
def test_no_bindings_at_all_is_a_warning(wired, tmp_path):
    empty = tmp_path / "bindings.json"
    empty.write_text("[]")
    settings.AUDIT_BINDINGS = str(empty)
    try:
        entries, warnings = bindings_for_day(DAY, datetime.timedelta(minutes=60))
    finally:
        settings.AUDIT_BINDINGS = ""
    assert (entries, warnings) == ([], [{"code": "no_bindings", "count": 1}])


@pytest.mark.django_db
def test_a_run_with_warnings_is_never_shown_as_a_plain_success(client, api, viewer):
    run = AuditRun.objects.create(
        date=DAY,
        status="succeeded",
        finality="FINAL",
        totals={"lost": 0, "unclaimed": 7, "distinct_published": 10},
        warnings=[{"code": "unclaimed", "count": 7}],
    )
    clean = AuditRun.objects.create(
        date=DAY, revision=2, status="succeeded", finality="FINAL", totals={"lost": 0}
    )
    body = api.as_user(viewer).get(f"/api/v1/audits/{run.pk}").json()
    assert (body["status"], body["outcome"]) == ("succeeded", "succeeded_with_warnings")
    assert body["warnings"] == [{"code": "unclaimed", "count": 7}]
    listed = {r["id"]: r for r in api.as_user(viewer).get("/api/v1/audits").json()["results"]}
    assert listed[run.pk]["outcome"] == "succeeded_with_warnings"
    assert (listed[clean.pk]["outcome"], listed[clean.pk]["warnings"]) == ("succeeded", [])

    client.force_login(viewer)
    page = client.get(f"/audits/{run.pk}/").content.decode()
    assert 'id="run-warnings"' in page and "succeeded with warnings" in page
    assert 'class="badge warn" id="run-finality"' in page  # not the green FINAL badge
    assert 'id="run-warnings"' not in client.get(f"/audits/{clean.pk}/").content.decode()
    listing = client.get("/audits/").content.decode()
    assert "1 warning</a>" in listing
