"""The audit log files: exact schema, partitions by the line's own UTC hour, one file per hour."""

import datetime
import json
import os
import socket

from recovery.client.logs import ConsumerLog, ProducerLog

PRODUCER_KEYS = {
    "v",
    "ts",
    "producer",
    "message_id",
    "exchange",
    "routing_key",
    "attempt",
    "outcome",
    "confirm_ms",
    "size",
}
CONSUMER_KEYS = {
    "v",
    "ts",
    "consumer_group",
    "consumer",
    "queue",
    "message_id",
    "redelivered",
    "outcome",
    "handle_ms",
}


def ms(*args):
    return int(datetime.datetime(*args, tzinfo=datetime.UTC).timestamp() * 1000)


def test_it_partitions_lines_by_their_utc_hour(tmp_path):
    log = ProducerLog(tmp_path, "orders")
    log.attempt(ms(2024, 3, 1, 23, 59, 59), "m1", "ex", "rk", 1, "ack", 1.5, 1024)
    log.attempt(ms(2024, 3, 2, 0, 0, 1), "m2", "ex", "rk", 2, "timeout", 5000.0, 10)
    log.close()

    name = f"producer-{socket.gethostname()}-{os.getpid()}.jsonl"
    first = tmp_path / "dt=2024-03-01" / "hour=23" / name
    second = tmp_path / "dt=2024-03-02" / "hour=00" / name
    ts = ms(2024, 3, 1, 23, 59, 59)
    assert first.read_text() == (
        f'{{"v":1,"ts":{ts},"producer":"orders","message_id":"m1","exchange":"ex",'
        '"routing_key":"rk","attempt":1,"outcome":"ack","confirm_ms":1.5,"size":1024}\n'
    )
    assert '"message_id":"m2"' in second.read_text()
    assert sorted(p.relative_to(tmp_path).parts[:2] for p in tmp_path.rglob("*.jsonl")) == [
        ("dt=2024-03-01", "hour=23"),
        ("dt=2024-03-02", "hour=00"),
    ]


def test_consumer_lines_have_exactly_the_documented_fields(tmp_path):
    log = ConsumerLog(tmp_path, "billing", "billing@host-1", "invoices")
    log.delivery(ms(2024, 3, 1, 12), "m1", False, "ack", 0.25)
    log.delivery(ms(2024, 3, 1, 12), "m1", True, "duplicate_skipped", 0.1)
    log.close()

    [path] = tmp_path.rglob("consumer-*.jsonl")
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [set(line) for line in lines] == [CONSUMER_KEYS, CONSUMER_KEYS]
    assert lines[1] == {
        "v": 1,
        "ts": ms(2024, 3, 1, 12),
        "consumer_group": "billing",
        "consumer": "billing@host-1",
        "queue": "invoices",
        "message_id": "m1",
        "redelivered": True,
        "outcome": "duplicate_skipped",
        "handle_ms": 0.1,
    }


def test_two_writers_in_one_process_share_one_file(tmp_path):
    a, b = ProducerLog(tmp_path, "a"), ProducerLog(tmp_path, "b")
    a.attempt(ms(2024, 3, 1, 12), "m1", "", "q", 1, "ack", 1.0, 1)
    b.attempt(ms(2024, 3, 1, 12), "m2", "", "q", 1, "ack", 1.0, 1)
    a.close()
    b.attempt(ms(2024, 3, 1, 12), "m3", "", "q", 1, "ack", 1.0, 1)
    b.close()
    [path] = tmp_path.rglob("*.jsonl")
    assert len(path.read_text().splitlines()) == 3


def test_the_client_library_imports_without_django():
    import subprocess
    import sys

    code = "import sys, recovery.client; assert 'django' not in sys.modules, 'django imported'"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
