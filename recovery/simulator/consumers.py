"""Consumer groups of the simulation: IdempotentConsumers whose handler acts out planned faults."""

import logging
import os
import socket
import threading

from recovery.client import IdempotentConsumer
from recovery.simulator.connections import FaultSkipped
from recovery.simulator.observe import observe_consumer
from recovery.simulator.spans import ConsumerSpans

log = logging.getLogger(__name__)

# Deliveries a simulated consumer may hold unacked. Also bounds what one crash or forced drop
# sends back to the queue as redeliveries.
PREFETCH = 50


class SimulatedFailure(Exception):
    """Raised by a handler told to fail: the consumer requeues or rejects the message."""


def _not_simulated(record):
    # The client logs every handler failure with its traceback; the planned ones are noise.
    return not (record.exc_info and isinstance(record.exc_info[1], SimulatedFailure))


class ConsumerWorker(threading.Thread):
    """One member of a consumer group. A crash stops its consumer without acking the message in
    hand; the worker then starts a fresh consumer (new name, empty in-memory dedup), as a process
    supervisor would restart a crashed process."""

    def __init__(self, simulation, queue, slot):
        super().__init__(name=f"simulate-{queue.group}-{slot}", daemon=True)
        self.simulation = simulation
        self.queue = queue
        self.group = queue.group
        self.slot = slot
        self.incarnation = 0
        self.connection_name = None
        self._current = None
        self._stopping = False
        self._lock = threading.Lock()

    def run(self):
        sim = self.simulation
        while True:
            with self._lock:
                if self._stopping:
                    return
                self.incarnation += 1
                self.connection_name = sim.connections.consumer_name(
                    self.group, self.slot, self.incarnation
                )
                consumer = IdempotentConsumer(
                    sim.url(self.connection_name),
                    self.queue.name,
                    group=self.group,
                    handler=self._handle,
                    log_dir=sim.config.consumer_log_dir,
                    prefetch=PREFETCH,
                    max_attempts=self.queue.max_attempts,
                    name=(
                        f"{self.group}@{socket.gethostname()}-{os.getpid()}"
                        f"-{self.slot}.{self.incarnation}"
                    ),
                )
                if sim.spans_for_group(self.group):
                    consumer._log = ConsumerSpans(
                        sim.span_sender, self.group, consumer.name, self.queue.name
                    )
                observe_consumer(consumer, sim.observer)
                self._current = consumer
            try:
                consumer.run()
            except Exception:
                log.exception("%s: consumer failed; restarting it", self.name)

    def stop(self):
        with self._lock:
            self._stopping = True
            consumer = self._current
        if consumer is not None:
            consumer.stop()

    def _handle(self, delivery):
        planned = self.simulation.planned(delivery.message_id)
        fault = planned.fault_for(self.group) if planned is not None else None
        if fault in ("reject", "poison"):
            raise SimulatedFailure(f"{fault} planned for {delivery.message_id} in {self.group}")
        if fault == "crash" and self.simulation.observer.claim_crash(
            delivery.message_id, self.group
        ):
            self._crash(delivery)

    def _crash(self, delivery):
        """Handled, logged, never acked: the connection dies under the consumer before its ack.

        The consumer writes its ``ack`` log line after the handler returns and then acks; the
        broker has already closed the connection by then, so the ack is lost and the message
        comes back ``redelivered`` to the group.
        """
        with self._lock:
            consumer = self._current
        consumer.stop()
        try:
            closed = self.simulation.connections.close(self.connection_name)
        except FaultSkipped as exc:
            # Handled and acked as if no crash was planned (as a connection never listed is).
            self.simulation.observer.skipped(f"{exc} ({delivery.message_id} in {self.group})")
            closed = False
        if not closed:
            log.warning(
                "%s: could not crash on %s: connection never listed", self.name, delivery.message_id
            )
        self.simulation.observer.crashed(delivery.message_id, self.group, closed)


def start_group_workers(simulation, queues, per_group):
    logging.getLogger("recovery.client.consumer").addFilter(_not_simulated)
    workers = [
        ConsumerWorker(simulation, queue, slot)
        for queue in queues
        if queue.consumed
        for slot in range(1, per_group + 1)
    ]
    for worker in workers:
        worker.start()
    return workers


def stop_group_workers(workers, timeout=15):
    for worker in workers:
        worker.stop()
    for worker in workers:
        worker.join(timeout)
    logging.getLogger("recovery.client.consumer").removeFilter(_not_simulated)
