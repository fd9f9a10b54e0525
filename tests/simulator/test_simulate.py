"""`manage.py simulate` on the real broker: what it leaves behind matches the truth it writes."""

import collections
import datetime
import json
import time

import pika
import pytest
from django.conf import settings
from django.core.management import CommandError, call_command

from recovery.broker.topology import Names
from recovery.simulator.demo import DemoTopology
from tests.simulator.helpers import BUSY_FAULTS, drain, of_run, read_log_lines, simulate

PRODUCER_FIELDS = {
    "v": int,
    "ts": int,
    "producer": str,
    "message_id": str,
    "exchange": str,
    "routing_key": str,
    "attempt": int,
    "outcome": str,
    "size": int,
}
CONSUMER_FIELDS = {
    "v": int,
    "ts": int,
    "consumer_group": str,
    "consumer": str,
    "queue": str,
    "message_id": str,
    "redelivered": bool,
    "outcome": str,
    "handle_ms": (int, float),
}
PRODUCER_OUTCOMES = {"ack", "nack", "returned", "timeout", "error"}
CONSUMER_OUTCOMES = {"ack", "reject", "requeue", "duplicate_skipped"}


@pytest.fixture
def broker(clean_queues, amqp):
    return amqp


def check_schema(rel_path, line, fields, outcomes):
    assert set(line) == set(fields) | ({"confirm_ms"} if "producer" in line else set()), line
    for name, kind in fields.items():
        assert isinstance(line[name], kind), (name, line)
    assert line["v"] == 1
    assert line["outcome"] in outcomes
    ts = datetime.datetime.fromtimestamp(line["ts"] / 1000, tz=datetime.UTC)
    assert rel_path.startswith(ts.strftime("dt=%Y-%m-%d/hour=%H/")), (rel_path, ts)


@pytest.mark.slow  # seconds of real simulated traffic each (the quick loop skips them)
def test_it_leaves_real_dead_letters_unroutables_returns_and_logs_matching_its_truth(
    broker, tmp_path
):
    truth, printed, paths = simulate(
        tmp_path, "--count", "150", "--seed", "busy", "--drops", "2", *BUSY_FAULTS
    )
    totals = truth["totals"]
    names = Names.from_settings()
    messages = truth["messages"]

    # Dead letters: every reason, copy for copy what the truth says each queue dead-lettered.
    dead = of_run(drain(broker, names.dead_letters), truth)
    reasons = collections.Counter(p.headers["x-first-death-reason"] for p, _ in dead)
    expected = collections.Counter(
        d["reason"] for m in messages.values() for d in m["dead_letters"]
    )
    assert reasons == expected
    assert set(reasons) == {"rejected", "expired", "maxlen", "delivery_limit"}
    assert len(dead) == totals["dead_letter_copies"]
    for properties, _ in dead:
        planned = messages[properties.message_id]
        assert properties.headers["x-first-death-queue"] in {
            d["queue"] for d in planned["dead_letters"]
        }
    # Unroutable messages reached the alternate exchange's queue.
    unrouted = of_run(drain(broker, names.unrouted), truth)
    assert len(unrouted) == totals["unrouted_copies"] >= totals["unroutable"] > 0
    assert {p.message_id for p, _ in unrouted} == {
        mid for mid, m in messages.items() if m["unroutable"]
    }
    # Returned and nacked give-ups were handed to Lazarus through the returns queue (by id: a
    # forward cut off by a dropped connection may be sent twice, which the collector dedups).
    returns = of_run(drain(broker, names.returns), truth)
    for kind in ("returned", "nacked"):
        handed = {p.message_id for p, _ in returns if p.headers["x-recovery-kind"] == kind}
        planned = {mid for mid, m in messages.items() if m.get("handed_to_lazarus") == kind}
        assert handed == planned
        assert len(handed) == totals[kind] > 0
    # Nothing is left in a demo queue.
    for queue in DemoTopology().queues:
        assert broker.queue_declare(queue.name, passive=True).method.message_count == 0

    # Both logs, in the schema of docs/design.md "The log contract", agree with the truth
    # line for line.
    producer = read_log_lines(paths["logs"] / "producer")
    consumer = read_log_lines(paths["logs"] / "consumer")
    for rel, line in producer:
        check_schema(rel, line, PRODUCER_FIELDS, PRODUCER_OUTCOMES)
    for rel, line in consumer:
        check_schema(rel, line, CONSUMER_FIELDS, CONSUMER_OUTCOMES)
    attempts = collections.Counter(line["message_id"] for _, line in producer)
    assert len(attempts) == totals["distinct_published"] == 150
    assert sum(attempts.values()) == totals["publish_attempts"] == len(producer)
    assert totals["producer_retries"] == sum(attempts.values()) - len(attempts)
    assert totals["producer_retries"] > 0  # nacks are retried; drops cut attempts off
    pairs = collections.defaultdict(list)
    for _, line in consumer:
        pairs[(line["message_id"], line["consumer_group"])].append(line)
    consumed = [
        p
        for p, lines in pairs.items()
        if any(x["outcome"] in ("ack", "duplicate_skipped") for x in lines)
    ]
    assert len(consumed) == totals["delivered_unique"]
    assert sum(1 for lines in pairs.values() if len(lines) > 1) == totals["dup_msgs"]
    assert sum(len(lines) - 1 for lines in pairs.values()) == totals["dup_deliveries"]
    assert len(consumer) == totals["consumer_lines"]

    # Crashes really happened and their redeliveries are logged as such.
    crashed = [mid for mid, m in messages.items() if m["duplicated_by_crash"]]
    assert crashed and totals["consumer_crashes"] >= len(crashed)
    for mid in crashed:
        group = messages[mid]["duplicated_by_crash"][0]
        assert any(x["redelivered"] for x in pairs[(mid, group)])
    assert totals["connections_closed"] > 0
    assert totals["lost"] == 0

    # The truth is printed and the bindings snapshot is written beside it.
    assert f"distinct_published             {totals['distinct_published']}" in printed
    assert json.loads(paths["bindings"].read_text()) == truth["bindings"]
    assert {b["consumer_group"] for b in truth["bindings"]} >= {"demo.billing", "demo.shipping"}


@pytest.mark.slow  # seconds of real simulated traffic each (the quick loop skips them)
def test_the_same_seed_gives_the_same_run(broker, tmp_path):
    # No drops or crashes (their effects are observed, not planned), and a confirm timeout no
    # loaded machine reaches: a slow confirm must not turn into an unplanned resend.
    args = (
        "--count",
        "120",
        "--seed",
        "same",
        "--drops",
        "0",
        "--crash",
        "0",
        "--confirm-timeout",
        "60",
        *BUSY_FAULTS[:-2],
    )
    first, _, _ = simulate(tmp_path, *args, name="first")
    second, _, _ = simulate(tmp_path, *args, name="second")
    assert first["run_id"] != second["run_id"]

    def shape(truth):
        return sorted(
            (
                m["index"],
                m["fault"],
                m["exchange"],
                m["routing_key"],
                m["target_group"],
                m["attempts"],
                tuple(m["consumed_by"]),
                tuple(sorted(m["dead_lettered"])),
            )
            for m in truth["messages"].values()
        )

    assert shape(first) == shape(second)
    assert first["totals"] == second["totals"]
    drain(broker, Names.from_settings().dead_letters)


@pytest.mark.slow  # seconds of real simulated traffic each (the quick loop skips them)
def test_forced_drops_close_only_the_simulators_connections(broker, tmp_path):
    truth, _, _ = simulate(
        tmp_path, "--count", "60", "--rate", "40", "--drops", "2", "--crash", "0"
    )
    assert truth["totals"]["connections_closed"] > 0
    # The test's own connection in the same vhost survived both drops.
    assert broker.is_open
    broker.queue_declare("", exclusive=True)


@pytest.mark.slow  # seconds of real simulated traffic each (the quick loop skips them)
def test_it_loops_and_accumulates_rounds(broker, tmp_path):
    truth, printed, _ = simulate(
        tmp_path, "--count", "10", "--every", "0.1", "--rounds", "2", "--drops", "0"
    )
    assert [r["round"] for r in truth["rounds"]] == [1, 2]
    assert truth["totals"]["distinct_published"] == 20 == len(truth["messages"])
    assert truth["totals"] == {
        name: sum(r["totals"][name] for r in truth["rounds"]) for name in truth["totals"]
    }
    assert "round 2:" in printed


@pytest.mark.slow  # seconds of real simulated traffic each (the quick loop skips them)
def test_a_duration_ends_the_loop(broker, tmp_path):
    # A round takes longer than the duration (the TTL queues alone need --ttl-ms to drain).
    started = time.monotonic()
    truth, _, _ = simulate(
        tmp_path, "--count", "5", "--every", "0.1", "--duration", "0.5", "--drops", "0"
    )
    assert len(truth["rounds"]) == 1
    assert time.monotonic() - started < 30


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--reject", "1.5"), "argument --reject"),
        (("--reject", "0.6", "--ttl", "0.6"), "more than 1"),
        (("--count", "0"), "at least 1"),
    ],
)
def test_bad_options_are_refused(args, message, tmp_path):
    with pytest.raises(CommandError, match=message):
        call_command("simulate", "--truth", str(tmp_path / "t.json"), *args)


def test_a_conflicting_demo_queue_is_a_clear_error(broker, tmp_path):
    broker.queue_declare("clash.capped", durable=True, arguments={"x-max-length": 99})
    try:
        with pytest.raises(CommandError, match="--prefix"):
            call_command(
                "simulate",
                "--prefix",
                "clash",
                "--count",
                "5",
                "--truth",
                str(tmp_path / "t.json"),
                "--log-dir",
                str(tmp_path),
            )
    finally:
        connection = pika.BlockingConnection(pika.URLParameters(settings.RABBITMQ_URL))
        connection.channel().queue_delete("clash.capped")
        connection.close()
