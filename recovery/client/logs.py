"""Producer and consumer audit logs: JSON Lines, UTC, partitioned by day and hour.

The nightly audit reconciles these files with the recovery store, so their shape is a contract
(``LOGS.md`` states it for writers in other languages). Every line carries ``"v": 1``, the schema
version, so the audit can read old and new files side by side.

Layout: ``<log_dir>/dt=YYYY-MM-DD/hour=HH/<role>-<host>-<pid>.jsonl`` where role is ``producer``
or ``consumer``. A line goes into the partition of its own ``ts`` (not of the moment it is
written), so a confirm that arrives just after the hour turns still lands beside its attempt and
the audit can prune partitions by time without slack. Several publishers or consumers in one
process share one file per role: ``open_log`` hands out one refcounted writer per (role, dir).
"""

import datetime
import json
import os
import socket
import threading
import time
from typing import Any

SCHEMA_VERSION = 1

# How often buffered lines reach the file. Shorter loses less on a hard crash (the audit then
# sees an orphan consumption or a missing attempt); longer saves write syscalls at 10k+ lines/s.
FLUSH_INTERVAL_S = 1.0

# Files kept open at once: the current hour and the one before it, for late lines.
OPEN_PARTITIONS = 2

PRODUCER_OUTCOMES = ("ack", "nack", "returned", "timeout", "error")
CONSUMER_OUTCOMES = ("ack", "reject", "requeue", "duplicate_skipped")


def partition_of(ts_ms):
    """Epoch milliseconds -> ('YYYY-MM-DD', 'HH') in UTC."""
    moment = datetime.datetime.fromtimestamp(ts_ms / 1000, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%d"), moment.strftime("%H")


class JsonLinesLog:
    """Append-only JSON Lines writer with hourly partitions. Thread-safe (one lock per file set)."""

    def __init__(self, log_dir, role):
        self.log_dir = os.fspath(log_dir)
        self.role = role
        self.filename = f"{role}-{socket.gethostname()}-{os.getpid()}.jsonl"
        self._files = {}  # (dt, hour) -> open file, insertion-ordered oldest first
        self._lock = threading.Lock()
        self._last_flush = time.monotonic()

    def path_for(self, ts_ms):
        dt, hour = partition_of(ts_ms)
        return os.path.join(self.log_dir, f"dt={dt}", f"hour={hour}", self.filename)

    def write(self, record):
        """Write one record (a dict with an int ``ts`` in epoch ms); ``v`` is added."""
        line = json.dumps({"v": SCHEMA_VERSION, **record}, separators=(",", ":")) + "\n"
        key = partition_of(record["ts"])
        with self._lock:
            handle = self._files.get(key)
            if handle is None:
                handle = self._open(key, record["ts"])
            handle.write(line)
            if time.monotonic() - self._last_flush >= FLUSH_INTERVAL_S:
                self._flush_locked()

    def _open(self, key, ts_ms):
        path = self.path_for(ts_ms)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        handle = open(path, "a", encoding="utf-8")  # noqa: SIM115 - kept open across writes
        self._files[key] = handle
        while len(self._files) > OPEN_PARTITIONS:
            oldest = min(self._files)
            self._files.pop(oldest).close()
        return handle

    def flush_if_due(self):
        """Called from idle loops so a quiet process still gets its lines to disk."""
        if time.monotonic() - self._last_flush >= FLUSH_INTERVAL_S:
            self.flush()

    def flush(self):
        with self._lock:
            self._flush_locked()

    def _flush_locked(self):
        for handle in self._files.values():
            handle.flush()
        self._last_flush = time.monotonic()

    def close(self):
        with self._lock:
            for handle in self._files.values():
                handle.close()
            self._files.clear()


_registry: dict[Any, Any] = {}
_registry_lock = threading.Lock()


def open_log(log_dir, role):
    """The shared writer for (log_dir, role) in this process; pair every call with ``release``."""
    key = (os.path.abspath(os.fspath(log_dir)), role)
    with _registry_lock:
        log, count = _registry.get(key, (None, 0))
        if log is None:
            log = JsonLinesLog(key[0], role)
        _registry[key] = (log, count + 1)
        return log


def release(log):
    key = (log.log_dir, log.role)
    with _registry_lock:
        _, count = _registry[key]
        if count <= 1:
            del _registry[key]
            log.close()
        else:
            _registry[key] = (log, count - 1)
            log.flush()


class ProducerLog:
    """One line per publish attempt."""

    def __init__(self, log_dir, producer):
        self.producer = producer
        self._log = open_log(log_dir, "producer") if log_dir else None

    def attempt(self, ts_ms, message_id, exchange, routing_key, attempt, outcome, confirm_ms, size):
        if self._log is None:
            return
        self._log.write(
            {
                "ts": ts_ms,
                "producer": self.producer,
                "message_id": message_id,
                "exchange": exchange,
                "routing_key": routing_key,
                "attempt": attempt,
                "outcome": outcome,
                "confirm_ms": confirm_ms,
                "size": size,
            }
        )

    def flush_if_due(self):
        if self._log is not None:
            self._log.flush_if_due()

    def close(self):
        if self._log is not None:
            release(self._log)
            self._log = None


class ConsumerLog:
    """One line per delivery handled (acked, rejected, requeued or skipped as a duplicate)."""

    def __init__(self, log_dir, consumer_group, consumer, queue):
        self.consumer_group = consumer_group
        self.consumer = consumer
        self.queue = queue
        self._log = open_log(log_dir, "consumer") if log_dir else None

    def delivery(self, ts_ms, message_id, redelivered, outcome, handle_ms):
        if self._log is None:
            return
        self._log.write(
            {
                "ts": ts_ms,
                "consumer_group": self.consumer_group,
                "consumer": self.consumer,
                "queue": self.queue,
                "message_id": message_id,
                "redelivered": redelivered,
                "outcome": outcome,
                "handle_ms": handle_ms,
            }
        )

    def flush_if_due(self):
        if self._log is not None:
            self._log.flush_if_due()

    def close(self):
        if self._log is not None:
            release(self._log)
            self._log = None
