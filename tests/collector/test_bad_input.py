"""A corpus of hostile input through a real collector worker: everything stored or quarantined,
nothing lost, the worker still running."""

import datetime
import sys

import pytest

from recovery.client.headers import LongBytes, RawTimestamp
from recovery.models import Message
from tests.helpers import declare_app_queue, publish, wait_for
from tests.helpers.collector import depth, drain_queue, reject_next

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

MAX_BODY = 25 * 1024 * 1024


def forged_x_death(entries):
    now = datetime.datetime(2026, 11, 20, 12, 0, 0)
    return [
        {
            "count": 1,
            "reason": "rejected",
            "queue": f"old.queue.{i}",
            "time": now,
            "exchange": "",
            "routing-keys": [f"old.queue.{i}"],
        }
        for i in range(entries)
    ]


def nested(levels):
    value = {"leaf": True}
    for _ in range(levels):
        value = {"n": value}
    return value


# (message_id, body, properties, expected: "stored" or the start of the quarantine reason)
CORPUS = [
    ("invalid-json", b'{"unterminated": [1, 2', {"content_type": "application/json"}, "stored"),
    ("thousands-of-headers", b"h", {"headers": {f"h-{i}": i for i in range(5000)}}, "stored"),
    # AMQP puts all properties in one frame (frame_max 128 KiB): 800 deaths is about the most.
    ("huge-x-death", b"d", {"headers": {"x-death": forged_x_death(800)}}, "stored"),
    (
        "non-utf8-strings",
        "Grüße".encode("latin-1"),
        {
            "headers": {"latin": LongBytes(b"caf\xe9"), "bytes": b"\xff\xfe"},
            "correlation_id": "corr-\u00e9",
            "app_id": b"\xffapp",  # a short string that is not UTF-8
            "content_type": "text/plain; charset=latin-1",
        },
        "stored",
    ),
    ("nul-characters", b"a\x00b", {"headers": {"v": "x\x00y"}, "type": "t\x00t"}, "stored"),
    ("millis-timestamp", b"t", {"headers": {"sent": RawTimestamp(1_795_000_000_123)}}, "stored"),
    ("empty-body", b"", {}, "stored"),
    ("twenty-megabytes", b"\xab" * (20 * 1024 * 1024), {}, "stored"),
    ("over-the-limit", b"\xcd" * (MAX_BODY + 1), {}, "body "),
    ("nul-in-a-header-name", b"k", {"headers": {"bad\x00name": 1}}, "database refused: "),
    ("nested-too-deep", b"n", {"headers": {"deep": nested(2000)}}, "headers nested too deep"),
]


def test_a_corpus_of_bad_input_is_stored_or_quarantined_and_the_worker_survives(
    worker_process, amqp
):
    worker = worker_process(COLLECTOR_MAX_BODY_BYTES=MAX_BODY).start()
    declare_app_queue(amqp, "bad.input")
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(50_000)  # only for encoding the deep table in this test
    try:
        for message_id, body, props, _expected in CORPUS:
            publish(amqp, "bad.input", body, message_id=message_id, **props)
    finally:
        sys.setrecursionlimit(limit)
    for _ in CORPUS:
        reject_next(amqp, "bad.input", timeout=30)
    # And straight into the other sources, with garbage where Lazarus reads structure.
    publish(
        amqp,
        "x.y",
        b"forged",
        exchange="recovery.dlx",
        message_id="x-death-not-a-list",
        headers={"x-death": "rejected, honest"},
    )
    publish(
        amqp,
        "recovery.returns",
        b"r",
        message_id="garbage-recovery-headers",
        headers={
            "x-recovery-kind": "returned",
            "x-recovery-attempts": "many",
            "x-recovery-origin": "not-an-id",
            "x-recovery-first-attempt-at": "yesterday",
            "x-recovery-replay-count": -5,
        },
    )
    extra = ["x-death-not-a-list", "garbage-recovery-headers"]

    to_store = [m for m, _b, _p, expected in CORPUS if expected == "stored"] + extra
    quarantine_reasons = {m: expected for m, _b, _p, expected in CORPUS if expected != "stored"}
    wait_for(
        lambda: Message.objects.filter(message_id__in=to_store).count() == len(to_store),
        timeout=120,
        message=f"{len(to_store)} stored messages; worker log:\n{worker.log()}",
    )
    wait_for(
        lambda: depth(amqp, "recovery.quarantine") == len(quarantine_reasons),
        timeout=60,
        message="the quarantined ones",
    )
    for queue in ("recovery.dead_letters", "recovery.returns"):
        wait_for(lambda q=queue: depth(amqp, q) == 0, message=f"{queue} to be empty")
    assert worker.alive(), worker.log()

    quarantined = {}
    for _method, props, body in drain_queue(amqp, "recovery.quarantine"):
        if isinstance(props.headers, dict) and "x-quarantine-reason" in props.headers:
            quarantined[props.message_id] = (props.headers["x-quarantine-reason"], len(body))
        else:  # the undecodable table: its reason is inside the raw bytes
            quarantined[props.message_id] = (props.headers.raw.decode("latin-1"), len(body))
    assert set(quarantined) == set(quarantine_reasons)
    for message_id, expected in quarantine_reasons.items():
        assert expected in quarantined[message_id][0], (message_id, quarantined[message_id])
    assert quarantined["over-the-limit"][1] == MAX_BODY + 1

    rows = {m.message_id: m for m in Message.objects.filter(message_id__in=to_store)}
    bodies = {m: b for m, b, _p, _e in CORPUS}
    for message_id in to_store[: -len(extra)]:
        assert rows[message_id].body_bytes == bodies[message_id], message_id
    assert len([h for h in rows["thousands-of-headers"].headers if h.startswith("h-")]) == 5000
    assert rows["huge-x-death"].death_count == 801
    assert rows["huge-x-death"].source_queue == "bad.input"
    assert rows["non-utf8-strings"].wire_headers["latin"] == LongBytes(b"caf\xe9")
    assert rows["non-utf8-strings"].properties["app_id"] == {"$t": "bytes", "v": "/2FwcA=="}
    assert rows["nul-characters"].wire_headers["v"] == "x\x00y"
    assert rows["nul-characters"].properties["type"] == {"$t": "str0", "v": ["t", "t"]}
    assert rows["millis-timestamp"].wire_headers["sent"] == RawTimestamp(1_795_000_000_123)
    assert rows["x-death-not-a-list"].reason == "unknown"
    garbage = rows["garbage-recovery-headers"]
    assert (garbage.kind, garbage.death_count, garbage.origin_id) == ("returned", 0, None)
    assert (garbage.replay_count, garbage.first_death_at) == (0, None)
