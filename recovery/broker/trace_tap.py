"""The tap: consumes a vhost's trace queue and writes ``recovery.broker.trace`` records.

One ``Tap`` per vhost, one thread each (``start_taps``), in a worker started with
``--trace-tap`` (``TraceTapStep``) or alone (``python -m recovery.broker.trace_tap``). Each
flush (``TRACE_FLUSH_SECONDS`` or ``TRACE_BATCH`` records):

1. writes the buffered records, one Parquet file per hour they fall in, and one ``consumed``
   coverage record (this process's span since its previous flush, offsets first..last), each
   tmp + fsync + rename;
2. then commits its state (last stream offset, last record time) beside them, the same way;
3. then acks the batch (``multiple``).

A crash between 1 and 3 replays the batch: never a loss, possibly duplicates, which the
records' stable ``key`` lets a reader drop. On a stream the consumer resumes at the committed
offset + 1 (``x-stream-offset``; prefetch ``basic.qos`` and manual acks, as streams require);
on a quorum queue unacked messages come back by themselves.

Each flush also polls the nodes (at most every ``NODE_POLL_SECONDS``): a node whose OS process
changed is a ``node_restart``
coverage record (tracing is node state a restart loses; the tap turns it on again when the
vhost had it on at the previous poll).
"""

import logging
import os
import socket
import threading
import time
import uuid

import pika
from django.conf import settings

from recovery.broker import trace
from recovery.broker.connection import connect
from recovery.broker.management import Management

log = logging.getLogger(__name__)

# How often a tap asks the management API which nodes run (and whether they trace the vhost).
NODE_POLL_SECONDS = 2.0


class Tap:
    def __init__(self, vhost, base=None, flush_seconds=None, batch=None, management=None):
        self.vhost = vhost
        self.base = trace.root(base)
        self.flush_seconds = (
            settings.TRACE_FLUSH_SECONDS if flush_seconds is None else flush_seconds
        )
        self.batch = batch or settings.TRACE_BATCH
        self.management = management or Management()
        self.tap_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.buffer = []
        self.last_tag = None
        self.seq = 0
        self.state = trace.tap_state(vhost, self.base) or {}
        self.span_from = trace.now_ms()
        self.first_offset = None
        self.node_pids = {}
        self.polled_at = None
        self.tracing_seen = None
        self.resume_checked = False
        self.records = 0
        self.trace_schema, self.coverage_schema = trace.trace_schema(), trace.coverage_schema()

    # -- consuming --------------------------------------------------------------------------

    def run(self, stop_event):
        conn = connect(self.vhost)
        try:
            channel = conn.channel()
            queue = settings.RECOVERY_TRACE_QUEUE
            declared = self.management.queue(self.vhost, queue)
            self.is_stream = declared.get("type") == "stream"
            channel.basic_qos(prefetch_count=min(self.batch * 2, 10000))
            arguments = {}
            if self.is_stream:
                last = self.state.get("last_offset")
                arguments["x-stream-offset"] = last + 1 if last is not None else "first"
            channel.basic_consume(queue, self.on_message, arguments=arguments)
            self.poll_nodes()
            next_flush = time.monotonic() + self.flush_seconds
            while not stop_event.is_set():
                conn.process_data_events(time_limit=min(0.2, self.flush_seconds))
                if len(self.buffer) >= self.batch or time.monotonic() >= next_flush:
                    self.flush(channel)
                    next_flush = time.monotonic() + self.flush_seconds
            self.flush(channel)
        finally:
            if conn.is_open:
                conn.close()

    def on_message(self, channel, method, properties, body):
        headers = properties.headers or {}
        offset = headers.get("x-stream-offset") if self.is_stream else None
        digest = (
            None if offset is not None else trace.message_digest(method.routing_key, headers, body)
        )
        if offset is not None:
            self.check_resume(offset)
            if self.first_offset is None:
                self.first_offset = offset
        self.buffer.append(
            trace.trace_record(
                method.routing_key,
                headers,
                len(body),
                trace.now_ms(),
                offset,
                digest,
                trace.body_sha(body),
            )
        )
        self.last_tag = method.delivery_tag

    def check_resume(self, offset):
        """The first offset given after a resume above the committed + 1: retention dropped it."""
        if self.resume_checked:
            return
        self.resume_checked = True
        last = self.state.get("last_offset")
        if last is not None and offset > last + 1:
            self.write_coverage(
                "retention_drop",
                self.state.get("last_ms") or self.span_from,
                trace.now_ms(),
                last + 1,
                offset - 1,
                offset - 1 - last,
            )

    # -- flushing ---------------------------------------------------------------------------

    def flush(self, channel):
        now = trace.now_ms()
        rows, self.buffer = self.buffer, []
        by_hour = {}
        for row in rows:
            by_hour.setdefault(trace.partition(self.base, row["ts_ms"]), []).append(row)
        self.seq += 1
        for directory, part in by_hour.items():
            name = f"trace-{self.tap_id.replace(':', '-')}-{self.seq:08d}.parquet"
            trace.write_table(directory / name, part, self.trace_schema)
        offsets = [r["stream_offset"] for r in rows if r["stream_offset"] is not None]
        self.write_coverage(
            "consumed",
            self.span_from,
            now,
            min(offsets) if offsets else None,
            max(offsets) if offsets else None,
            len(rows),
        )
        self.span_from = now
        if offsets:
            self.state["last_offset"] = max(offsets)
        if rows:
            self.state["last_ms"] = max(r["ts_ms"] for r in rows)
        self.state["flushed_ms"] = now
        self.state["tap"] = self.tap_id
        trace.commit_state(self.vhost, self.state, self.base)
        if self.last_tag is not None:
            channel.basic_ack(self.last_tag, multiple=True)
            self.last_tag = None
        self.records += len(rows)
        self.poll_nodes()

    def write_coverage(self, kind, from_ms, until_ms, first, last, count, node=None):
        row = {
            "tap": self.tap_id,
            "kind": kind,
            "vhost": self.vhost,
            "node": node,
            "from_ms": int(from_ms),
            "until_ms": int(until_ms),
            "first_offset": first,
            "last_offset": last,
            "records": count,
        }
        directory = trace.partition(self.base / trace.COVERAGE_DIR, from_ms)
        self.seq += 1
        name = f"coverage-{self.tap_id.replace(':', '-')}-{self.seq:08d}.parquet"
        trace.write_table(directory / name, [row], self.coverage_schema)

    def poll_nodes(self):
        """A node whose OS process changed, or that a poll saw down (``rabbitmqctl stop_app``
        keeps the process), restarted: a gap from the last poll that saw it up to now, and
        tracing (node state) back on, on every node, if the vhost had it on. (Not its uptime:
        the management API samples it every few seconds, so "now - uptime" jitters by as much
        and a restart cannot be told from a stale sample.)"""
        if self.polled_at is not None and time.monotonic() - self.polled_at < NODE_POLL_SECONDS:
            return
        self.polled_at = time.monotonic()
        now = trace.now_ms()
        try:
            nodes = self.management.request("GET", "/nodes?columns=name,os_pid,running") or []
            # on anywhere: the vhost is traced (a node down or just restarted says off/unknown)
            tracing = any(trace.tracing_by_node(self.vhost, self.management).values())
        except Exception as exc:  # noqa: BLE001 - the next poll tries again
            log.warning("trace tap: cannot poll the nodes: %s", exc)
            return
        restarted = False
        for node in nodes:
            name, pid = node["name"], node.get("os_pid")
            previous = self.node_pids.get(name)
            if not node.get("running") or pid is None:
                if previous is not None:  # down: the gap runs from the last poll that saw it up
                    self.node_pids[name] = (previous[0], previous[1], True)
                continue
            if previous is not None and (previous[0] != pid or previous[2]):
                restarted = True
                self.write_coverage("node_restart", previous[1], now, None, None, 0, node=name)
            self.node_pids[name] = (pid, now, False)
        # Tracing is node state: the restarted node lost it, while the vhost the management
        # API shows (from the node that answered) may still say on. Turned on again on every
        # node whenever the vhost had it on.
        if restarted and (self.tracing_seen or tracing):
            log.warning("trace tap: a node restarted; tracing %s on again", self.vhost)
            trace.set_tracing(self.vhost, True, self.management)
            tracing = True
        self.tracing_seen = tracing


def start_taps(vhosts=None, **kwargs):
    """One tap thread per vhost; returns (stop_event, threads)."""
    stop_event = threading.Event()
    threads = []
    for vhost in vhosts or settings.RECOVERY_VHOSTS:
        tap = Tap(vhost, **kwargs)
        thread = threading.Thread(
            target=_run_forever, args=(tap, stop_event), name=f"trace-tap-{vhost}", daemon=True
        )
        thread.tap = tap
        thread.start()
        threads.append(thread)
    return stop_event, threads


def _run_forever(tap, stop_event):
    while not stop_event.is_set():
        try:
            tap.run(stop_event)
        except (pika.exceptions.AMQPError, OSError, Exception) as exc:  # noqa: BLE001
            # What was not acked comes back (or is read again from the committed offset).
            log.warning("trace tap %s: %r; reconnecting", tap.vhost, exc)
            tap.buffer, tap.last_tag = [], None
            tap.resume_checked = False
            tap.state = trace.tap_state(tap.vhost, tap.base) or {}
            stop_event.wait(2.0)


def stop_taps(stop_event, threads, timeout=15.0):
    stop_event.set()
    for thread in threads:
        thread.join(timeout)


class TraceTapStep:
    """Celery worker bootstep (``--trace-tap``, default TRACE_TAP_ENABLED): the tap threads in
    the worker's main process, started after the pool like the collector's, stopped (their
    last batch flushed and acked) on a warm shutdown. Built lazily so this module imports
    without Celery's bootsteps."""


def trace_tap_step():
    from celery import bootsteps

    class _TraceTapStep(bootsteps.StartStopStep):
        __doc__ = TraceTapStep.__doc__
        requires = ("celery.worker.components:Pool",)

        def __init__(self, worker, trace_tap=None, **kwargs):
            self.enabled = settings.TRACE_TAP_ENABLED if trace_tap is None else trace_tap
            self.stop_event, self.threads = None, []
            super().__init__(worker, **kwargs)

        def start(self, worker):
            self.stop_event, self.threads = start_taps()
            log.info("trace tap started: %s", ", ".join(t.name for t in self.threads))

        def stop(self, worker):
            if self.stop_event is not None:
                stop_taps(self.stop_event, self.threads)
                self.stop_event = None

        shutdown = stop

    _TraceTapStep.__name__ = "TraceTapStep"
    return _TraceTapStep


def main():
    import signal

    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    django.setup()
    logging.basicConfig(level=logging.INFO)
    stop_event, threads = start_taps()
    signal.signal(signal.SIGTERM, lambda *_: stop_event.set())
    signal.signal(signal.SIGINT, lambda *_: stop_event.set())
    while not stop_event.wait(0.5):
        pass
    stop_taps(stop_event, threads)


if __name__ == "__main__":
    main()
