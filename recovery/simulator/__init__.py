"""The fault-injecting simulator behind ``manage.py simulate``.

Producers (ReliablePublisher) and consumer groups (IdempotentConsumer) run over demo exchanges
while the simulator injects faults — rejects, TTL expiry, max-length overflow, unroutable keys,
basic.returns, nacks, poison messages, consumer crashes, forced connection drops — and records
what it did and saw as the ground truth the audit and the collector are checked against.

    demo.py         the demo topology and its bindings snapshot
    plan.py         the seeded plan: routes and faults per message
    connections.py  named connections; forced closes through the management API
    consumers.py    consumer groups whose handlers act out the plan
    observe.py      the observer, the audit-log tees and the dead-letter/unrouted taps
    truth.py        observations -> per-message truth and totals in the audit's terms
    run.py          rounds: publish, settle, stop, write the truth
"""

from recovery.simulator.plan import Rates
from recovery.simulator.run import Simulation, SimulationConfig

__all__ = ["Rates", "Simulation", "SimulationConfig"]
