"""More collector processes than the worker's own: one Python process is one core at most.

A drain's cost on the collector side is Python: decoding each delivery (pika's framing, every
header with its type), the row, the fingerprint, the binary COPY. One process, however many
threads it runs, uses one core for that (the GIL), and on a drain that core is the limit
(bench/collector.py). So a worker started with ``--collector`` runs ``COLLECTOR_PROCESSES - 1``
more collector processes beside its own threads; they consume the same queues as more consumers
(RabbitMQ spreads the deliveries between them) and store through their own connections. Exactly
once does not depend on who stores a message: every process acks only after its commit, and the
store's unique fingerprint drops a redelivery whichever process stored it first.

Each extra process is a fresh interpreter (``python -m recovery.collector.main``), not a fork of
the worker, whose other threads could hold locks at fork time. The worker supervises them:

- one that exits while the worker runs is started again (after a short back-off);
- on the worker's warm shutdown they get SIGTERM, store and ack what they hold, and exit;
- if the worker itself dies (kill -9), the kernel kills them too (``PR_SET_PDEATHSIG``), so no
  orphan keeps consuming after its parent is gone, and what they held goes back to the queue.
"""

import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
import time

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1
RESTART_BACKOFF_S = (1.0, 30.0)  # first, longest
POLL_S = 0.5


def collector_process_count(setting):
    """COLLECTOR_PROCESSES: a number, or 0 for one per CPU core this process may use."""
    if setting > 0:
        return setting
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def _die_with_parent():
    """In the child between fork and exec: SIGKILL when the parent (the worker) dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class CollectorProcesses:
    """Starts, restarts and stops ``count`` extra collector processes."""

    def __init__(self, count, command=None):
        self.count = count
        self.command = command or [sys.executable, "-m", "recovery.collector.main"]
        self.children = [None] * count
        self.restarts = 0
        self.stopping = threading.Event()
        self.supervisor = threading.Thread(
            target=self._supervise, name="collector-processes", daemon=True
        )

    def start(self):
        for slot in range(self.count):
            self.children[slot] = self._spawn(slot)
        self.supervisor.start()
        return self

    def pids(self):
        return [child.pid for child in self.children if child is not None]

    def _spawn(self, slot):
        env = {**os.environ, "LAZARUS_COLLECTOR_PARENT": str(os.getpid())}
        child = subprocess.Popen(  # noqa: S603 - our own interpreter and module
            self.command, env=env, preexec_fn=_die_with_parent, close_fds=True
        )
        log.info("collector process %d started (pid %d)", slot + 1, child.pid)
        return child

    def _supervise(self):
        backoff = [RESTART_BACKOFF_S[0]] * self.count
        while not self.stopping.wait(POLL_S):
            for slot, child in enumerate(self.children):
                code = child.poll()
                if code is None or self.stopping.is_set():
                    continue
                log.warning(
                    "collector process %d (pid %d) exited with %s; starting it again in %.0fs",
                    slot + 1,
                    child.pid,
                    code,
                    backoff[slot],
                )
                if self.stopping.wait(backoff[slot]):
                    return
                backoff[slot] = min(backoff[slot] * 2, RESTART_BACKOFF_S[1])
                self.children[slot] = self._spawn(slot)
                self.restarts += 1

    def stop(self, timeout=15.0):
        """SIGTERM (each stores and acks what it holds), then SIGKILL whatever is left."""
        self.stopping.set()
        for child in self.children:
            if child is not None and child.poll() is None:
                child.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for child in self.children:
            if child is None:
                continue
            try:
                child.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("collector process %d did not stop; killing it", child.pid)
                child.kill()
                child.wait()
        if self.supervisor.is_alive():
            self.supervisor.join(timeout=POLL_S * 2)
