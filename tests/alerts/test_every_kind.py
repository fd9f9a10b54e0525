"""Every rule kind through its whole life with real parts: its condition made true for real
(stored messages, a paused job, a queue without a consumer, a discard the broker counts...),
then firing once, a reminder at its interval, a muted twin that changes state and tells nobody,
and one notification when the condition is made false again. The broker_alarm kind needs a real
disk alarm, which blocks every publisher: its life is in the disruptive test of test_broker.py."""

import datetime
import tempfile
import urllib.parse
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace

import pika
import pytest
from django.conf import settings
from django.test import override_settings
from django.utils import timezone

from recovery.alerts.deliver import deliver_due
from recovery.alerts.engine import evaluate
from recovery.broker.management import Management
from recovery.broker.tasks import take_sample
from recovery.broker.topology import Names, wire
from recovery.models import (
    AlertRule,
    AuditRun,
    CollectorHeartbeat,
    Message,
    ReplayJob,
    Status,
)
from recovery.retention.run import apply_retention
from tests.helpers import make_message, wait_for
from tests.helpers.alerts import Receiver, webhook
from tests.helpers.collector import publish_and_reject

pytestmark = pytest.mark.django_db

MINUTE = datetime.timedelta(minutes=1)


def depth(vhost, queue):
    return Management().queue(vhost, queue).get("messages")


def consumers(vhost, queue):
    return Management().queue(vhost, queue).get("consumers") or 0


@dataclass
class Life:
    """How to make one kind's condition true (``fire``) and false again (``clear``)."""

    params: dict = field(default_factory=dict)
    scope: Callable = lambda ctx: {}
    fire: Callable = lambda ctx: None
    clear: Callable = lambda ctx: None
    # When the cleared condition is evaluated, after the first evaluation (for the kinds whose
    # condition is a time window, clearing it is time passing).
    resolved_after: datetime.timedelta = 7 * MINUTE
    # The audit kind reads "yesterday": its life is evaluated at noon so it never spans midnight.
    at_noon: bool = False


def _fire_group(ctx):
    make_message(source_queue="kinds.groups", group_key=f"g-{uuid.uuid4().hex[:8]}")


def _fire_open(ctx):
    ctx.message = make_message(source_queue="kinds.open")


def _clear_open(ctx):
    Message.objects.filter(pk=ctx.message.pk).update(status=Status.DISCARDED)


def _clear_collector_down(ctx):
    CollectorHeartbeat.objects.create(
        worker="kinds@host", vhost="kinds-nowhere", queue="q", updated_at=ctx.resolve_at
    )


def _fire_lag(ctx):
    queue = settings.RECOVERY_DEAD_LETTER_QUEUE
    ctx.channel.basic_publish("", queue, b"waiting for a collector")
    wait_for(lambda: depth(ctx.vhost, queue) == 1, timeout=20, message="a message waiting")


def _clear_lag(ctx):
    queue = settings.RECOVERY_DEAD_LETTER_QUEUE
    ctx.channel.queue_purge(queue)
    wait_for(lambda: depth(ctx.vhost, queue) == 0, timeout=20, message="the queue drained")


def _fire_job(ctx):
    ctx.job = ReplayJob.objects.create(state="paused", state_reason="breaker: target down")


def _clear_job(ctx):
    ReplayJob.objects.filter(pk=ctx.job.pk).update(state=ReplayJob.State.CANCELLED)


def _clear_audit(ctx):
    AuditRun.objects.create(
        date=ctx.t0.date() - datetime.timedelta(days=1),
        status="succeeded",
        totals={"lost": 0},
        warnings=[],
    )


def _clear_idle(ctx):
    for queue in Names.from_settings().source_queues:
        ctx.channel.basic_consume(queue, lambda *args: None)
    for queue in Names.from_settings().source_queues:
        wait_for(lambda q=queue: consumers(ctx.vhost, q) > 0, timeout=20, message=queue)


def _fire_uncovered(ctx):
    ctx.private.queue_declare("kinds.naked")


def _clear_uncovered(ctx):
    ctx.private.queue_delete("kinds.naked")


def _fire_tally(ctx):
    ctx.channel.queue_delete("kinds.discarding")
    ctx.channel.queue_declare("kinds.discarding")  # no dead-letter exchange: a reject discards
    take_sample()
    publish_and_reject(ctx.channel, "kinds.discarding", 3)
    sample = take_sample()
    assert sample.discarded == 3, sample


def _clear_tally(ctx):
    ctx.channel.queue_delete("kinds.discarding")
    # Time passes: the next beat sample counts nothing more, and the window has left the discard.
    take_sample(now=ctx.resolve_at)


def _fire_retention_archive(ctx):
    # A real retention run whose archive directory cannot be created (under a regular file:
    # even root cannot), over an expired message: it stops, deleting nothing.
    ctx.expired = make_message(source_queue="kinds.retention", status=Status.REPLAYED)
    Message.objects.filter(pk=ctx.expired.pk).update(updated_at=ctx.t0 - 400 * 24 * 60 * MINUTE)
    with (
        tempfile.NamedTemporaryFile() as blocker,
        override_settings(RETENTION_ARCHIVE_DIR=f"{blocker.name}/archive"),
    ):
        assert "archive_error" in apply_retention()
    assert Message.objects.filter(pk=ctx.expired.pk).exists()


def _clear_retention_archive(ctx):
    with (
        tempfile.TemporaryDirectory() as directory,
        override_settings(RETENTION_ARCHIVE_DIR=directory),
    ):
        assert apply_retention()["archived"] == 1
    assert not Message.objects.filter(pk=ctx.expired.pk).exists()


LIVES = {
    "new_failure_group": Life(
        scope=lambda ctx: {"queue": "kinds.groups"},
        fire=_fire_group,
        resolved_after=3 * 60 * MINUTE,
    ),
    "open_messages": Life(
        params={"threshold": 0},
        scope=lambda ctx: {"queue": "kinds.open"},
        fire=_fire_open,
        clear=_clear_open,
    ),
    "open_growth": Life(
        params={"per_minute": 0, "window_minutes": 10},
        scope=lambda ctx: {"queue": "kinds.open"},
        fire=_fire_open,
        resolved_after=15 * MINUTE,
    ),
    "collector_down": Life(
        params={"seconds": 60},
        scope=lambda ctx: {"vhost": "kinds-nowhere"},
        clear=_clear_collector_down,
    ),
    "collector_lag": Life(
        params={"threshold": 0},
        scope=lambda ctx: {"vhost": ctx.vhost},
        fire=_fire_lag,
        clear=_clear_lag,
    ),
    "replay_job": Life(fire=_fire_job, clear=_clear_job),
    "audit": Life(params={"missing_after": "06:00"}, clear=_clear_audit, at_noon=True),
    "queue_without_consumers": Life(
        scope=lambda ctx: {"vhost": ctx.vhost},
        clear=_clear_idle,
    ),
    "uncovered_queues": Life(
        scope=lambda ctx: {"vhost": ctx.private_vhost},
        fire=_fire_uncovered,
        clear=_clear_uncovered,
    ),
    "broker_tally": Life(
        params={"window_minutes": 15},
        fire=_fire_tally,
        clear=_clear_tally,
        resolved_after=20 * MINUTE,
    ),
    "retention_archive": Life(fire=_fire_retention_archive, clear=_clear_retention_archive),
}


def test_every_kind_but_the_disk_alarm_has_a_life_here():
    assert set(LIVES) | {"broker_alarm"} == set(AlertRule.Kind.values)


@pytest.fixture
def private_vhost():
    """An empty wired vhost: nothing another test declared is uncovered in it."""
    name = f"lazarus-kinds-{uuid.uuid4().hex[:8]}"
    management = Management()
    management.put_vhost(name)
    management.grant(name, urllib.parse.urlparse(settings.RABBITMQ_URL).username or "guest")
    wire(name)
    base = urllib.parse.urlparse(settings.RABBITMQ_URL)
    url = base._replace(path="/" + urllib.parse.quote(name, safe="")).geturl()
    connection = pika.BlockingConnection(pika.URLParameters(url))
    # Watched, as a vhost a rule may scope to must be (checks read no other's queues).
    watched = settings.RECOVERY_VHOSTS
    settings.RECOVERY_VHOSTS = [*watched, name]
    yield name, connection.channel()
    settings.RECOVERY_VHOSTS = watched
    connection.close()
    management.delete_vhost(name)


# These two wait for the management API's statistics (refreshed every 5 s) to see consumers and
# depths change: seconds each, so the quick loop leaves them to make test.
WAITS_FOR_STATISTICS = {"collector_lag", "queue_without_consumers"}
# The broker tally counts node-wide dead-letter counters: alone (see the ``serial`` marker).
NODE_WIDE = {"broker_tally"}


def _marks(kind):
    marks = [pytest.mark.slow] if kind in WAITS_FOR_STATISTICS else []
    return marks + ([pytest.mark.serial] if kind in NODE_WIDE else [])


@pytest.mark.usefixtures("clean_queues")
@pytest.mark.parametrize(
    "kind",
    [pytest.param(kind, marks=_marks(kind)) for kind in sorted(LIVES)],
)
def test_a_rule_fires_reminds_resolves_and_its_muted_twin_tells_nobody(kind, wired, private_vhost):
    life = LIVES[kind]
    connection = pika.BlockingConnection(pika.URLParameters(settings.RABBITMQ_URL))
    now = timezone.now()
    t0 = now.replace(hour=12, minute=0, second=0, microsecond=0) if life.at_noon else now
    ctx = SimpleNamespace(
        vhost=wired,
        channel=connection.channel(),
        private_vhost=private_vhost[0],
        private=private_vhost[1],
        t0=t0,
        resolve_at=t0 + life.resolved_after,
    )
    receiver = Receiver()
    try:
        hook = webhook(receiver.url)
        scope = life.scope(ctx)
        loud = AlertRule.objects.create(
            name=f"{kind} loud", kind=kind, params=life.params, remind_every=5 * MINUTE, **scope
        )
        muted = AlertRule.objects.create(
            name=f"{kind} muted",
            kind=kind,
            params=life.params,
            remind_every=5 * MINUTE,
            muted_until=t0 + 10 * 60 * MINUTE,
            **scope,
        )
        for r in (loud, muted):
            r.channels.set([hook])

        life.fire(ctx)
        events = [evaluate(now=t0 + m * MINUTE) for m in (0, 2, 6)]
        life.clear(ctx)
        events.append(evaluate(now=ctx.resolve_at))

        for r in (loud, muted):
            r.refresh_from_db()
            assert r.last_error == "", (kind, r.last_error)
        assert [e[loud.pk] for e in events] == ["firing", None, "reminder", "resolved"], (
            kind,
            loud.last_summary,
        )
        assert [e[muted.pk] for e in events] == ["firing", None, None, "resolved"]
        assert [t.state for t in muted.transitions.order_by("at")] == ["firing", "ok"]
        assert loud.state == muted.state == AlertRule.State.OK

        deliver_due(now=ctx.resolve_at)
        sent = receiver.payloads()
        assert [(p["rule"]["id"], p["event"]) for p in sent] == [
            (loud.pk, "firing"),
            (loud.pk, "reminder"),
            (loud.pk, "resolved"),
        ]
        assert sent[0]["value"] and sent[0]["summary"]
    finally:
        receiver.close()
        if connection.is_open:
            connection.close()
