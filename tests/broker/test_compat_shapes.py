"""RabbitMQ 4.x answers Lazarus can only be shown here in their shape (tests/broker/shapes_4x.json):
with management statistics disabled a queue has no ``messages*``, ``consumers`` nor
``message_stats`` (and before 4.2.5 no ``policy`` fields): unknown, never 0 and never ok. Where
a number matters (the tally's backlog, the collector lag) it comes from a passive declare on
the real broker."""

import copy
import json
import pathlib
import urllib.parse

import pika
import pytest

from recovery.broker.management import Management
from recovery.errors import ManagementError
from tests.helpers import publish, wait_for

SHAPES = json.loads((pathlib.Path(__file__).parent / "shapes_4x.json").read_text())

STATISTICS = (
    "messages",
    "messages_ready",
    "messages_unacknowledged",
    "consumers",
    "consumer_capacity",
    "consumer_utilisation",
    "messages_dlx",
    "message_stats",
    "delivery_limit",
)
POLICY_FIELDS = ("policy", "operator_policy", "effective_policy_definition")


def queues(statistics=True, policy_fields=True, vhost="/"):
    """The recorded queues, as a broker with statistics disabled (and before 4.2.5) gives them."""
    out = copy.deepcopy(SHAPES["queues"])
    for queue in out:
        queue["vhost"] = vhost
        for key in () if statistics else STATISTICS:
            queue.pop(key, None)
        for key in () if policy_fields else POLICY_FIELDS:
            queue.pop(key, None)
    return out


class Recorded(Management):
    """A management API that answers from recorded shapes (pure logic: no broker)."""

    def __init__(self, queues, operator_policies=None, version=True):
        super().__init__("http://guest:guest@127.0.0.1:1/")
        self.answers = {
            "/queues": queues,
            "/policies": SHAPES["policies"],
            "/operator-policies": (
                SHAPES["operator_policies"] if operator_policies is None else operator_policies
            ),
            "/overview": SHAPES["overview"] if version else {},
            "/nodes": SHAPES["nodes"],
            "/connections": [],
            "/exchanges": [],
        }

    def request(self, method, path, payload=None):
        assert method == "GET", (method, path)
        parts = [urllib.parse.unquote(part) for part in path.split("?")[0].split("/")]
        answer = self.answers["/" + parts[1]]
        if isinstance(answer, ManagementError):
            raise answer
        if parts[1] == "queues" and len(parts) > 3:
            return next(q for q in answer if q["name"] == parts[3])
        return answer


def by_name(rows):
    return {row.name: row for row in rows}


class TestDeliveryLimits:
    def test_it_reads_the_limit_4x_reports(self):
        from recovery.broker.coverage import UNLIMITED, effective_delivery_limit

        limits = {q["name"]: effective_delivery_limit(q, (4, 1)) for q in queues()}
        assert limits == {
            "recovery.dead_letters": UNLIMITED,
            "recovery.unrouted": 5,
            "recovery.returns": 20,
            "recovery.parked": UNLIMITED,  # a classic queue has no delivery limit
            "recovery.quarantine": UNLIMITED,
        }

    def test_without_statistics_it_works_the_limit_out_from_policies(self):
        """4.2.5+: statistics disabled, but the policy fields are there."""
        from recovery.broker.coverage import UNLIMITED, effective_delivery_limit

        limits = {q["name"]: effective_delivery_limit(q, (4, 2)) for q in queues(False)}
        assert limits["recovery.dead_letters"] == UNLIMITED
        assert limits["recovery.unrouted"] == 5  # the operator policy's cap wins over -1
        assert limits["recovery.returns"] == 20  # no policy: 4.x's default

    def test_without_policy_fields_it_matches_the_policy_lists_or_says_unknown(self):
        from recovery.broker.coverage import UNLIMITED, effective_delivery_limit

        bare = by_name_dict(queues(False, False))
        policies, operator = SHAPES["policies"], SHAPES["operator_policies"]
        assert effective_delivery_limit(bare["recovery.dead_letters"], (4, 1)) is None
        assert (
            effective_delivery_limit(bare["recovery.dead_letters"], (4, 1), policies, operator)
            == UNLIMITED
        )
        assert effective_delivery_limit(bare["recovery.unrouted"], (4, 1), policies, operator) == 5
        # The operator policies could not be read: what they cap is unknown.
        assert effective_delivery_limit(bare["recovery.unrouted"], (4, 1), policies, None) is None
        # No policy, no argument: 20 on 4.x, unlimited before, unknown without a version.
        assert effective_delivery_limit(bare["recovery.returns"], (4, 0), [], []) == 20
        assert effective_delivery_limit(bare["recovery.returns"], (3, 13), [], []) == UNLIMITED
        assert effective_delivery_limit(bare["recovery.returns"], None, [], []) is None
        assert effective_delivery_limit({"name": "q"}, (4, 1), [], []) is None  # no type

    def test_the_uncovered_check_names_each_limited_or_unknown_recovery_queue(self):
        from recovery.broker.coverage import uncovered

        rows = by_name(uncovered("/", Recorded(queues())))
        assert set(rows) == {"recovery.unrouted", "recovery.returns"}
        assert rows["recovery.unrouted"].problem == "recovery_delivery_limit"
        assert rows["recovery.unrouted"].detail == (
            "delivery limit 5: a message returned to it more often is parked in "
            "recovery.parked (the collector stores it)"
        )
        assert "operator policy 'cap-deliveries' sets it" in rows["recovery.unrouted"].fix
        assert rows["recovery.returns"].detail == (
            "delivery limit 20: a message returned to it more often is dropped by the broker"
        )

        # Statistics disabled before 4.2.5 and operator policies unreadable: unknown, not ok.
        blind = Recorded(queues(False, False), operator_policies=ManagementError("HTTP 401"))
        rows = by_name(uncovered("/", blind))
        assert {name: row.problem for name, row in rows.items()} == {
            "recovery.dead_letters": "delivery_limit_unknown",
            "recovery.unrouted": "delivery_limit_unknown",
            "recovery.returns": "delivery_limit_unknown",
        }


def by_name_dict(rows):
    return {row["name"]: row for row in rows}


class TestPolicyApplyTo:
    """Since 3.12 a policy can apply to one queue type. 3.10 (here) refuses such a policy, so
    this one is recorded; the real 3.10 policy with apply-to queues is in test_topology.py."""

    def test_a_quorum_queues_policy_hides_lazarus_on_quorum_queues_only(self):
        from recovery.broker.coverage import uncovered

        app = [
            {"name": "orders.q", "type": "quorum", "arguments": {}},
            {"name": "orders.c", "type": "classic", "arguments": {}},
        ]
        recorded = Recorded(app)
        recorded.answers["/policies"] = [
            {
                "name": "lazarus-dead-letter",
                "pattern": "^orders\\.",
                "apply-to": "queues",
                "priority": 0,
                "definition": {"dead-letter-exchange": "recovery.dlx"},
            },
            {
                "name": "team-quorum",
                "pattern": "^orders\\.",
                "apply-to": "quorum_queues",
                "priority": 5,
                "definition": {"max-length": 1000},
            },
        ]
        rows = by_name(uncovered("/", recorded))
        assert set(rows) == {"orders.q"}
        assert (rows["orders.q"].problem, rows["orders.q"].policy) == (
            "no_dead_letter_exchange",
            "team-quorum",
        )


class TestBrokerPage:
    def test_missing_numbers_are_unknown_and_4x_sockets_are_not_reported(self, settings):
        from recovery.broker.health import read

        settings.RECOVERY_VHOSTS = ["/"]
        # With the policy lists readable, the limit is worked out from them...
        listed = {q.name: q for q in read(Recorded(queues(False, False))).queues}
        assert listed["recovery.dead_letters"].delivery_limit == "unlimited"
        assert listed["recovery.unrouted"].delivery_limit == "5"
        # ...and without the operator policies it is unknown.
        blind = Recorded(queues(False, False), operator_policies=ManagementError("HTTP 401"))
        health = read(blind)
        [node] = health.nodes
        assert (node.sockets_used, node.sockets_total) == (None, None)
        shown = {q.name: q for q in health.queues}
        dead = shown["recovery.dead_letters"]
        assert (dead.messages, dead.ready, dead.unacked, dead.consumers) == (None,) * 4
        assert dead.delivery_limit == "unknown"
        assert dead.limit_problem.startswith("the management API does not say")
        assert shown["recovery.parked"].delivery_limit == "unlimited"

    @pytest.mark.django_db
    def test_the_page_says_unknown_never_zero(self, client, viewer, monkeypatch, settings):
        from recovery.broker import health

        settings.RECOVERY_VHOSTS = ["/"]
        blind = Recorded(queues(False, False), operator_policies=ManagementError("HTTP 401"))
        monkeypatch.setattr(health, "Management", lambda: blind)
        client.force_login(viewer)
        page = client.get("/broker/?refresh=1").content.decode()
        table = page[page.index('id="recovery-queues"') :][:6000]
        row = table[table.index("recovery.dead_letters") :].split("</tr>")[0]
        assert row.count("unknown") >= 5, row  # messages, ready, unacked, consumers, limit
        assert "nobody collects" not in row
        assert ">0<" not in row


class TestNodeAlarmsNotReported:
    """A node whose alarm flags the management API leaves out: unknown, neither an alarm nor
    "no alarm"; the broker_alarm rule neither fires nor clears."""

    @staticmethod
    def blind_nodes():
        recorded = Recorded(queues())
        nodes = copy.deepcopy(SHAPES["nodes"])
        for node in nodes:
            del node["mem_alarm"], node["disk_free_alarm"]
        recorded.answers["/nodes"] = nodes
        return recorded

    def test_the_health_is_not_ok_and_says_what_it_does_not_know(self, settings):
        from recovery.broker.health import read

        settings.RECOVERY_VHOSTS = ["/"]
        health = read(self.blind_nodes())
        [node] = health.nodes
        assert (node.mem_alarm, node.disk_free_alarm) == (None, None)
        assert health.alarms == []
        assert health.unknown == [
            "rabbit@a: the management API does not say its memory alarm",
            "rabbit@a: the management API does not say its disk alarm",
        ]
        assert not health.ok
        assert read(Recorded(queues())).unknown == []

    def test_the_broker_alarm_rule_is_unknown(self, settings):
        import datetime

        from recovery.alerts.checks import BrokerUnknown, broker_alarm
        from recovery.models import AlertRule

        settings.RECOVERY_VHOSTS = ["/"]
        now = datetime.datetime.now(datetime.UTC)
        with pytest.raises(BrokerUnknown, match="memory alarm"):
            broker_alarm(AlertRule(kind="broker_alarm"), now, self.blind_nodes())
        assert not broker_alarm(AlertRule(kind="broker_alarm"), now, Recorded(queues())).firing


class TestAlertsWithoutStatistics:
    """The lag and consumer checks fall back to a passive declare on the real broker."""

    @pytest.mark.django_db(transaction=True)
    def test_collector_lag_and_consumers_come_from_a_passive_declare(
        self, amqp, wired, clean_queues
    ):
        import datetime

        from recovery.alerts.checks import collector_lag, queue_without_consumers
        from recovery.models import AlertRule

        for i in range(3):
            publish(amqp, "recovery.returns", b"w", message_id=f"lag-{i}")
        wait_for(
            lambda: amqp.queue_declare("recovery.returns", passive=True).method.message_count == 3,
            message="3 messages waiting",
        )
        blind = Recorded(queues(False, False, vhost=wired))
        now = datetime.datetime.now(datetime.UTC)
        lag = collector_lag(AlertRule(kind="collector_lag", params={"threshold": 2}), now, blind)
        assert (lag.firing, lag.value, lag.items) == (True, 3, [f"{wired}/recovery.returns: 3"])
        idle = queue_without_consumers(AlertRule(kind="queue_without_consumers"), now, blind)
        assert idle.value == 4  # nobody collects in this test: every source queue is idle
        assert f"{wired}/recovery.returns" in idle.items

    def test_only_unknown_coverage_is_an_unknown_rule_not_an_ok_one(self, settings):
        import datetime

        from recovery.alerts.checks import CoverageUnknown, uncovered_queues
        from recovery.models import AlertRule

        settings.RECOVERY_VHOSTS = ["/"]
        blind = Recorded(queues(False, False), operator_policies=ManagementError("HTTP 401"))
        rule = AlertRule(kind="uncovered_queues")
        with pytest.raises(CoverageUnknown, match="does not say"):
            uncovered_queues(rule, datetime.datetime.now(datetime.UTC), blind)


class TestTally:
    def test_volatile_queues_and_other_protocols_are_not_discarded_application_messages(self):
        from recovery.broker.tally import parse

        assert parse(SHAPES["prometheus"]) == {
            "dead_lettered:rejected:at_most_once": 10,
            "dead_lettered:rejected:disabled": 3,
            "dead_lettered:rejected:at_least_once": 4,
            "dead_lettered:maxlen:disabled": 1,  # the volatile queue's 250 are left out
            "unroutable_dropped": 2,  # AMQP 1.0's 30 and MQTT's 5 are left out
            "unroutable_returned": 6,
        }

    @pytest.mark.django_db(transaction=True)
    def test_the_backlog_comes_from_a_passive_declare_without_statistics(
        self, amqp, wired, clean_queues, settings
    ):
        from recovery.broker.tally import backlog

        for i in range(2):
            publish(amqp, "recovery.dead_letters", b"b", message_id=f"backlog-{i}")
        publish(amqp, "recovery.parked", b"p", message_id="backlog-parked")
        wait_for(
            lambda: (
                amqp.queue_declare("recovery.dead_letters", passive=True).method.message_count == 2
            ),
            message="2 dead letters waiting",
        )
        assert backlog(Recorded(queues(False, False, vhost=wired))) == 3
        # A vhost it cannot count in: the sample is unknown (record() keeps the error), not 0.
        settings.RECOVERY_VHOSTS = [wired, f"{wired}-not-there"]
        with pytest.raises(pika.exceptions.AMQPConnectionError):
            backlog(Recorded(queues(False, False, vhost=wired)))
