"""The broker page and the broker's own tally against the store, with the real broker (its
rabbitmq_prometheus counters, its management API) and the real collector; a real disk alarm
(disruptive: it blocks every publisher on the shared broker while it lasts)."""

import datetime
import json
import subprocess

import pika
import pytest
from django.conf import settings
from django.core.cache import cache
from django.utils import timezone

from recovery.alerts.deliver import deliver_due
from recovery.alerts.engine import evaluate
from recovery.broker import tally
from recovery.broker.management import Management
from recovery.broker.tasks import take_sample
from recovery.broker.topology import Names
from recovery.models import AlertRule, Message
from tests.helpers import declare_app_queue, free_port, wait_for
from tests.helpers.alerts import Receiver, rule, webhook
from tests.helpers.collector import publish_and_reject

pytestmark = pytest.mark.django_db

NODE = """# TYPE rabbitmq_global_messages_dead_lettered_rejected_total counter
rabbitmq_global_messages_dead_lettered_rejected_total{queue_type="rabbit_classic_queue",dead_letter_strategy="at_most_once"} %(rejected)d
rabbitmq_global_messages_dead_lettered_rejected_total{queue_type="rabbit_classic_queue",dead_letter_strategy="disabled"} %(discarded)d
rabbitmq_global_messages_dead_lettered_rejected_total{queue_type="rabbit_quorum_queue",dead_letter_strategy="at_least_once"} %(quorum)d
# TYPE rabbitmq_global_messages_dead_lettered_confirmed_total counter
rabbitmq_global_messages_dead_lettered_confirmed_total{queue_type="rabbit_quorum_queue",dead_letter_strategy="at_least_once"} 999
# TYPE rabbitmq_global_messages_unroutable_dropped_total counter
rabbitmq_global_messages_unroutable_dropped_total{protocol="amqp091"} %(dropped)d
"""  # noqa: E501 - the plugin's own lines


def node(**counts):
    return NODE % {"rejected": 0, "discarded": 0, "quorum": 0, "dropped": 0, **counts}


def test_counters_are_summed_per_strategy_and_a_restarted_node_counts_from_zero():
    a = tally.parse(node(rejected=100, discarded=3, quorum=5, dropped=2))
    assert a == {
        "dead_lettered:rejected:at_most_once": 100,
        "dead_lettered:rejected:disabled": 3,
        "dead_lettered:rejected:at_least_once": 5,
        "unroutable_dropped": 2,
    }
    b = tally.parse(node(rejected=130, discarded=3, quorum=9, dropped=2))
    restarted = tally.parse(node(rejected=4))
    rose, resets = tally.deltas(
        {"n1": a, "n2": b}, {"n1": b, "n2": restarted, "n3": tally.parse(node(rejected=50))}
    )
    assert resets == ["n2"]  # its counters went back: all of them are this interval's
    assert rose["dead_lettered:rejected:at_most_once"] == 30 + 4  # n3 is a baseline: nothing
    assert rose["dead_lettered:rejected:at_least_once"] == 4
    by_reason = tally.compare(rose, {("dead_letter", "rejected"): 30, ("dead_letter", ""): 2})
    assert by_reason == {
        "rejected": {"broker": 38, "discarded": 0, "stored": 30},
        "other": {"broker": 0, "discarded": 0, "stored": 2},
    }


def test_text_without_the_counters_is_an_error_not_a_zero():
    with pytest.raises(tally.CountersUnavailable, match="3.10 or later"):
        tally.parse("# TYPE rabbitmq_queues gauge\nrabbitmq_queues 3\n")


def management_depth(queue):
    return Management().queue(settings.RECOVERY_VHOSTS[0], queue).get("messages")


@pytest.fixture
def quiet_node(wired):
    """The tally reads node-wide counters, so nothing else may dead-letter while a test counts.

    Earlier tests of the session can leave delayed replays in this vhost's delay queues
    (REPLAY_DELAY_PREFIX): when their TTL ends the broker dead-letters them to their target, and
    the counters rise by one (a make test run saw 11 dead-lettered for the test's 10). Delete
    those queues, then wait until the counters hold still.
    """
    management = Management()
    vhost = settings.RECOVERY_VHOSTS[0]
    for queue in management.queues(vhost):
        if queue["name"].startswith(settings.REPLAY_DELAY_PREFIX + "."):
            path = f"/queues/{management.quote(vhost)}/{management.quote(queue['name'])}"
            management.request("DELETE", path)
    previous = None

    def steady():
        nonlocal previous
        now = tally.scrape()
        was, previous = previous, now
        return now == was

    wait_for(steady, timeout=20, interval=1.0, message="the node's dead-letter counters to settle")
    # The backlog too: a dead letter an earlier test left in a recovery queue (or one the
    # management API, up to 5 s behind, still counts after the collector took it) would change
    # it between the baseline and the sample, a gap of 1 that is no loss (a make test run saw
    # 40, 40 and a gap of 1 right after the body tests). Empty them; wait until the management
    # API says so.
    names = Names.from_settings()
    recovery_queues = (names.dead_letters, names.parked, names.quarantine)
    for name in recovery_queues:
        path = f"/queues/{management.quote(vhost)}/{management.quote(name)}/contents"
        management.request("DELETE", path)
    wait_for(
        lambda: all(management_depth(name) == 0 for name in recovery_queues),
        timeout=20,
        interval=0.5,
        message="the recovery queues empty in the management API",
    )


@pytest.mark.serial
@pytest.mark.usefixtures("collector", "quiet_node")
def test_the_tally_matches_what_lazarus_stored_and_counts_what_the_broker_threw_away(
    amqp, client, api, viewer
):
    declare_app_queue(amqp, "tally.kept")
    amqp.queue_delete("tally.naked")
    amqp.queue_declare("tally.naked")  # no dead-letter exchange: a reject discards
    amqp.exchange_declare("tally.nowhere", "direct")  # no binding, no alternate exchange
    hook = Receiver()
    broker_rule = rule("broker_tally", channels=[webhook(hook.url)])
    try:
        baseline = take_sample()
        assert baseline.error == "" and baseline.gap is None  # a baseline compares nothing

        publish_and_reject(amqp, "tally.kept", 40)
        publish_and_reject(amqp, "tally.naked", 6)
        for i in range(3):
            amqp.basic_publish("tally.nowhere", "nobody", f"lost-{i}".encode())
        wait_for(
            lambda: Message.objects.filter(source_queue="tally.kept").count() == 40,
            timeout=30,
            message="40 dead letters stored",
        )
        # The management API's depths lag up to 5 s behind the queue.
        wait_for(lambda: management_depth(settings.RECOVERY_DEAD_LETTER_QUEUE) == 0, timeout=20)
        sample = take_sample()

        assert sample.error == ""
        assert (sample.dead_lettered, sample.stored_dead_letters, sample.gap) == (40, 40, 0)
        assert (sample.discarded, sample.unroutable_dropped) == (6, 3)
        assert sample.by_reason == {"rejected": {"broker": 40, "discarded": 6, "stored": 40}}

        evaluate()
        broker_rule.refresh_from_db()
        assert broker_rule.state == AlertRule.State.FIRING and broker_rule.last_value == 9
        assert "6 dead-lettered with no dead-letter exchange: discarded" in broker_rule.last_items
        assert "3 unroutable publishes dropped" in broker_rule.last_items

        client.force_login(viewer)
        page = client.get("/broker/").content.decode()
        assert 'id="tally-loss"' in page and "the broker discarded 6" in page
        # Not a green "no alarm" beside a loss; where they went, and where to look.
        assert 'id="broker-state">no alarm, but losing messages<' in page
        reasons = page[page.index('id="tally-by-reason"') :].split("</table>")[0]
        assert "<td>rejected</td><td>40</td><td>40</td><td>0</td><td><strong>6</strong></td>" in (
            reasons
        )
        assert 'id="tally-uncovered-link"' in page
        body = api.as_user(viewer).get("/api/v1/broker").json()
        assert body["tally"]["last_hour"]["discarded"] == 6
        assert body["tally"]["last_hour"]["unroutable_dropped"] == 3
        assert body["tally"]["last_hour"]["gap"] == 0
        assert not body["tally"]["stale"] and not body["tally"]["unreadable"]
    finally:
        hook.close()
        amqp.queue_delete("tally.naked")
        amqp.exchange_delete("tally.nowhere")


@pytest.mark.serial
@pytest.mark.usefixtures("clean_queues", "quiet_node")
def test_dead_letters_waiting_are_no_gap_and_a_purged_recovery_queue_is_one(amqp):
    names = settings.RECOVERY_DEAD_LETTER_QUEUE
    declare_app_queue(amqp, "tally.waiting")
    take_sample()
    publish_and_reject(amqp, "tally.waiting", 10)  # no collector running: they wait in its queue
    wait_for(lambda: management_depth(names) == 10, timeout=20)

    waiting = take_sample()
    assert (waiting.dead_lettered, waiting.backlog_change, waiting.gap) == (10, 10, 0)

    amqp.queue_purge(names)  # what a careless operator (or a queue length limit) does
    wait_for(lambda: management_depth(names) == 0, timeout=20)
    purged = take_sample()
    assert (purged.dead_lettered, purged.backlog_change, purged.gap) == (0, -10, 10)

    broker_rule = rule("broker_tally")
    evaluate()
    broker_rule.refresh_from_db()
    assert broker_rule.state == AlertRule.State.FIRING and broker_rule.last_value == 10
    assert "10 dead-lettered by the broker, not stored by Lazarus nor waiting" in (
        broker_rule.last_summary
    )


@pytest.mark.usefixtures("wired")
def test_counters_that_cannot_be_read_are_unknown_not_zero(client, api, viewer, settings):
    broker_rule = rule("broker_tally")
    evaluate()
    broker_rule.refresh_from_db()
    assert "no broker tally sample" in broker_rule.last_error  # never sampled: not "ok"

    settings.RABBITMQ_PROMETHEUS_URLS = [f"http://127.0.0.1:{free_port()}/metrics"]
    sample = take_sample()
    assert sample.error and sample.gap is None and sample.discarded is None
    evaluate()
    broker_rule.refresh_from_db()
    assert "could not be read" in broker_rule.last_error
    assert broker_rule.state == AlertRule.State.UNKNOWN  # never "ok"

    client.force_login(viewer)
    page = client.get("/broker/").content.decode()
    assert 'id="tally-unreadable"' in page and "unknown, not zero" in page
    body = api.as_user(viewer).get("/api/v1/broker").json()
    assert body["tally"]["unreadable"] and "127.0.0.1" in body["tally"]["error"]
    assert client.get("/alerts/").content.decode().count("cannot check") >= 1


@pytest.mark.usefixtures("wired")
def test_the_broker_page_shows_nodes_and_recovery_queues_and_says_when_it_cannot_see(
    client, viewer, settings
):
    # A queue declared a moment ago has no statistics yet (the management API leaves its
    # consumers out for a stats interval, and the page rightly says "unknown"); and an earlier
    # test's collector on this vhost, stopped a moment ago, is still counted for as long: wait
    # until the statistics say what holds in this test, no consumer on the source queues.
    sources = set(Names.from_settings().source_queues)
    wait_for(
        lambda: all(
            q.get("consumers") == 0
            for q in Management().queues(settings.RECOVERY_VHOSTS[0]) or [{"name": None}]
            if q["name"] in sources or q["name"] is None
        ),
        timeout=20,
        message="the recovery queues' statistics, with no collector counted",
    )
    client.force_login(viewer)
    cache.clear()
    page = client.get("/broker/").content.decode()
    assert "rabbit@" in page and settings.RECOVERY_DEAD_LETTER_QUEUE in page
    assert 'id="broker-state">no alarm' in page
    assert "none: nobody collects" in page  # no collector runs in this test

    settings.RABBITMQ_MANAGEMENT_URL = f"http://guest:guest@127.0.0.1:{free_port()}"
    page = client.get("/broker/").content.decode()
    assert 'id="broker-state">no alarm' in page  # cached for a few seconds: not re-read
    page = client.get("/broker/?refresh=1").content.decode()
    assert 'id="broker-error"' in page and "cannot see it" in page
    assert "no alarm" not in page
    cache.clear()


def rabbitmqctl(*args):
    return subprocess.run(["rabbitmqctl", *args], check=True, capture_output=True, text=True)


@pytest.mark.disruptive
@pytest.mark.usefixtures("wired")
def test_a_real_disk_alarm_fires_blocks_publishers_and_resolves(client, viewer):
    """The disk free limit set above the free space: the broker raises its disk alarm for real
    and blocks publishers; restored after, the alarm clears and the rule resolves."""
    management = Management()
    [before] = management.request("GET", "/nodes")
    assert not before["disk_free_alarm"]
    hook = Receiver()
    channel = webhook(hook.url)
    alarm_rule = rule(
        "broker_alarm", channels=[channel], remind_every=datetime.timedelta(minutes=5)
    )
    muted_rule = rule(
        "broker_alarm",
        name="broker_alarm muted",
        channels=[channel],
        remind_every=datetime.timedelta(minutes=5),
        muted_until=timezone.now() + datetime.timedelta(hours=1),
    )
    publisher = pika.BlockingConnection(pika.URLParameters(settings.RABBITMQ_URL))
    try:
        rabbitmqctl("set_disk_free_limit", str(before["disk_free"] * 10))
        wait_for(
            lambda: management.request("GET", "/nodes")[0]["disk_free_alarm"],
            timeout=30,
            message="the disk alarm",
        )
        # A publish now blocks the connection (flow control): the broker says so.
        publisher.channel().basic_publish("", "nowhere", b"blocked")
        publisher.process_data_events(0)
        wait_for(
            lambda: any(
                isinstance(c, dict) and c.get("state") in ("blocked", "blocking")
                for c in management.request("GET", "/connections?columns=state")
            ),
            timeout=20,
            message="a blocked connection",
        )
        now = timezone.now()
        first = evaluate(now=now)
        assert (first[alarm_rule.pk], first[muted_rule.pk]) == ("firing", "firing")
        later = evaluate(now=now + datetime.timedelta(minutes=6))
        assert (later[alarm_rule.pk], later[muted_rule.pk]) == ("reminder", None)
        alarm_rule.refresh_from_db()
        assert alarm_rule.state == AlertRule.State.FIRING
        assert any("disk alarm" in item for item in alarm_rule.last_items)
        assert any("blocked by flow control" in item for item in alarm_rule.last_items)
        client.force_login(viewer)
        cache.clear()
        page = client.get("/broker/").content.decode()
        assert 'id="broker-alarms"' in page and "disk alarm" in page
    finally:
        rabbitmqctl("set_disk_free_limit", str(before["disk_free_limit"]))
        wait_for(
            lambda: not management.request("GET", "/nodes")[0]["disk_free_alarm"],
            timeout=30,
            message="the disk alarm cleared",
        )
        publisher.close()
        cache.clear()
    # The management database refreshes a connection's state every stats interval (5 s): until
    # then a connection still reads "blocked", and the rule rightly keeps firing on it.
    wait_for(
        lambda: (
            not any(
                isinstance(c, dict) and c.get("state") in ("blocked", "blocking")
                for c in management.request("GET", "/connections?columns=state")
            )
        ),
        timeout=30,
        message="no blocked connection left",
    )
    resolved = evaluate(now=timezone.now() + datetime.timedelta(minutes=7))
    assert (resolved[alarm_rule.pk], resolved[muted_rule.pk]) == ("resolved", "resolved")
    alarm_rule.refresh_from_db()
    assert alarm_rule.state == AlertRule.State.OK
    deliver_due(now=timezone.now() + datetime.timedelta(minutes=7))
    sent = [json.loads(r["body"]) for r in hook.requests]
    hook.close()
    # The muted twin changed state with it and told nobody.
    assert [(p["rule"]["id"], p["event"]) for p in sent] == [
        (alarm_rule.pk, "firing"),
        (alarm_rule.pk, "reminder"),
        (alarm_rule.pk, "resolved"),
    ]
