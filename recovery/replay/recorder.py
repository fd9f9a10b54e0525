"""Outcome writers for a job runner: threads with their own database connections.

The store's writes (one update of a wide, heavily indexed message row per replayed message, plus
its item, attempt and activity rows) are the slowest part of a bulk replay. Writing them beside
the runner's claiming and publishing, on more than one connection, lets them overlap.
"""

import queue
import threading

# Writers per job (each one database connection).
RECORDERS = 2


class Recorder(threading.Thread):
    """Writes outcomes on its own database connection while the runner claims and publishes:
    the store's writes (one message row update per message) are the slowest part of a replay,
    and here they overlap with everything else."""

    def __init__(self, store, user_id, via, wakeup):
        super().__init__(name=f"replay-recorder:{store.job_id}", daemon=True)
        self.store, self.user_id, self.via = store, user_id, via
        # Set after each batch: the runner waits on it for room in its window.
        self.wakeup = wakeup
        self.batches = queue.Queue()
        self.lock = threading.Lock()
        self.backlog = 0  # rows handed over, not yet written
        self.confirmed = 0
        self.error = None
        self.idle = threading.Event()
        self.idle.set()

    def put(self, rows):
        if self.error is not None:
            raise self.error
        with self.lock:
            self.backlog += len(rows)
            self.idle.clear()
        self.batches.put(rows)

    def run(self):
        try:
            while (rows := self.batches.get()) is not None:
                if self.error is None:
                    try:
                        counts = self.store.record(rows, self.user_id, self.via)
                    except Exception as exc:  # handed to the runner thread, which stops
                        self.error = exc
                        counts = {"confirmed": 0}
                with self.lock:
                    self.backlog -= len(rows)
                    self.confirmed += counts["confirmed"]
                    if self.backlog == 0:
                        self.idle.set()
                self.wakeup.set()
        finally:
            self.store.close()

    def wait_idle(self):
        while not self.idle.wait(1.0):
            if not self.is_alive():
                break
        if self.error is not None:
            raise self.error

    def stop(self):
        self.batches.put(None)
        self.join(30)


class Recorders:
    """A few recorders side by side (each its own connection): PostgreSQL spreads the message
    row updates over its cores. Batches go to the least busy one."""

    def __init__(self, recorders):
        self.recorders = recorders
        for recorder in recorders:
            recorder.start()

    @property
    def backlog(self):
        return sum(r.backlog for r in self.recorders)

    @property
    def confirmed(self):
        return sum(r.confirmed for r in self.recorders)

    def put(self, rows):
        min(self.recorders, key=lambda r: r.backlog).put(rows)

    def wait_idle(self):
        for recorder in self.recorders:
            recorder.wait_idle()

    def stop(self):
        for recorder in self.recorders:
            recorder.stop()
