"""Several vhosts served at once, and the per-source counters /healthz shows."""

from datetime import timedelta

import pytest
import time_machine

from recovery.broker.management import Management
from recovery.collector.consumer import start_collectors, stop_collectors
from recovery.collector.health import STALE_AFTER, collector_health
from recovery.models import CollectorHeartbeat, Kind
from recovery.replay import replay_message
from tests.helpers import declare_app_queue, make_user, publish, wait_for
from tests.helpers.collector import open_channel, reject_next, stored

pytestmark = pytest.mark.django_db(transaction=True)

SOURCES = ("recovery.dead_letters", "recovery.unrouted", "recovery.returns", "recovery.parked")


@pytest.fixture
def two_vhosts(transactional_db, wired, clean_queues, second_vhost, settings):
    settings.RECOVERY_VHOSTS = [wired, second_vhost]
    stop_event, threads = start_collectors(flush_seconds=0.05)
    yield wired, second_vhost, threads
    stop_collectors(stop_event, threads)


def test_one_collector_serves_every_configured_vhost(two_vhosts):
    first, second, threads = two_vhosts
    assert sorted(t.name for t in threads) == sorted(
        f"collector:{vhost}:{queue}" for vhost in (first, second) for queue in SOURCES
    )
    for vhost in (first, second):
        channel = open_channel(vhost)
        declare_app_queue(channel, "orders")  # the same queue name in both vhosts
        publish(channel, "orders", vhost.encode(), message_id=f"from-{vhost}")
        reject_next(channel, "orders")
        channel.exchange_declare(
            "shop", "topic", arguments={"alternate-exchange": "recovery.unrouted"}
        )
        publish(channel, "nowhere", b"?", exchange="shop", message_id=f"lost-{vhost}")
        channel.connection.close()

    for vhost in (first, second):
        [dead] = stored(message_id=f"from-{vhost}")
        assert (dead.vhost, dead.source_queue, bytes(dead.body)) == (
            vhost,
            "orders",
            vhost.encode(),
        )
        [lost] = stored(message_id=f"lost-{vhost}")
        assert (lost.vhost, lost.kind) == (vhost, Kind.UNROUTABLE)

    # A replay goes back to the vhost the message came from.
    [message] = stored(message_id=f"from-{second}")
    assert replay_message(message).outcome == "confirmed"
    channel = open_channel(second)
    method, _props, body = wait_for(
        lambda: (lambda r: r if r[0] else None)(channel.basic_get("orders", auto_ack=True)),
        message="the replay in the second vhost",
    )
    assert body == second.encode()
    assert open_channel(first).queue_declare("orders", passive=True).method.message_count == 0


def test_health_shows_every_source_of_every_vhost(two_vhosts, client):
    first, second, _threads = two_vhosts
    channel = open_channel(second)
    declare_app_queue(channel, "hq")
    for i in range(5):
        publish(channel, "hq", b"x", message_id=f"h{i}")
        reject_next(channel, "hq")
    stored(5, vhost=second)

    def dead_letters_of_second():
        health = collector_health()
        source = next(
            s
            for s in health["sources"]
            if (s["vhost"], s["queue"]) == (second, "recovery.dead_letters")
        )
        return (health, source) if source["collected"] == 5 else None

    health, source = wait_for(dead_letters_of_second, timeout=30, message="the heartbeat")
    assert health["running"] and health["broker"] == {"ok": True}
    assert [(s["vhost"], s["queue"]) for s in health["sources"]] == [
        (vhost, queue) for vhost in (first, second) for queue in SOURCES
    ]
    assert source["source"] == "dead_letters"
    assert (source["depth"], source["collectors"], source["duplicates"]) == (0, 1, 0)
    assert source["quarantined"] == source["errors"] == 0
    assert source["last_collected_at"] is not None
    assert isinstance(source["rate"], float) and source["rate"] >= 0
    assert health["quarantine"] == {first: 0, second: 0}
    assert len(health["threads"]) == 2 * len(SOURCES)  # 8: one per source queue and vhost

    client.force_login(make_user("health-admin", "admin"))  # the detail is for global admins
    report = client.get("/healthz").json()
    assert {(s["vhost"], s["queue"]) for s in report["collector"]["sources"]} == {
        (vhost, queue) for vhost in (first, second) for queue in SOURCES
    }


def test_health_shows_the_lag_when_nobody_collects(transactional_db, wired, clean_queues, amqp):
    CollectorHeartbeat.objects.all().delete()
    declare_app_queue(amqp, "lagging")
    for i in range(3):
        publish(amqp, "lagging", b"x", message_id=f"lag{i}")
        reject_next(amqp, "lagging")

    health = collector_health()

    assert health["running"] is False
    dead_letters = next(s for s in health["sources"] if s["queue"] == "recovery.dead_letters")
    assert (dead_letters["depth"], dead_letters["collectors"], dead_letters["rate"]) == (3, 0, 0)
    assert health["lag"][wired]["recovery.dead_letters"] == 3


def test_a_collector_that_stops_beating_is_running_for_30_seconds_then_not(
    transactional_db, wired, clean_queues
):
    """The clock moves, nothing else: a heartbeat counts for STALE_AFTER (30 s), not a second
    longer, so a dead collector leaves the health report (and its alerts fire) on time."""
    CollectorHeartbeat.objects.all().delete()
    beat = CollectorHeartbeat.objects.create(
        worker="host-1:42", vhost=wired, queue="recovery.dead_letters", rate=12.5
    )

    with time_machine.travel(beat.updated_at + STALE_AFTER - timedelta(seconds=1), tick=False):
        health = collector_health()
    assert health["running"] is True
    dead_letters = next(s for s in health["sources"] if s["queue"] == "recovery.dead_letters")
    assert (dead_letters["collectors"], dead_letters["rate"]) == (1, 12.5)

    with time_machine.travel(beat.updated_at + STALE_AFTER + timedelta(seconds=1), tick=False):
        health = collector_health()
    assert health["running"] is False and health["threads"] == []
    dead_letters = next(s for s in health["sources"] if s["queue"] == "recovery.dead_letters")
    assert (dead_letters["collectors"], dead_letters["rate"]) == (0, 0)


def test_health_says_when_a_vhost_is_not_wired_or_not_there(transactional_db, wired, settings):
    unwired = f"{wired}-unwired"
    management = Management()
    management.put_vhost(unwired)
    management.grant(unwired, "guest")
    try:
        settings.RECOVERY_VHOSTS = [wired, unwired]
        health = collector_health()
        assert health["broker"] == {"ok": True}
        assert set(health["lag"][unwired].values()) == {None}
        depths = [s["depth"] for s in health["sources"] if s["vhost"] == unwired]
        assert depths == [None] * len(SOURCES)

        settings.RECOVERY_VHOSTS = [wired, f"{wired}-missing"]
        health = collector_health()
        assert health["broker"]["ok"] is False
        assert "vhost" in health["broker"]["error"]
    finally:
        management.delete_vhost(unwired)
