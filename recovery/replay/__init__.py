"""The replay engine: one message at a time (``one``), operator curation (``curation``), bulk jobs
(``runner`` with its asynchronous ``publisher`` and its database side ``job_store``), and
targets/delays (``targets``). Jobs are created through ``recovery.replay.jobs``; their Celery
tasks are in ``tasks``. Retention is the store's (``recovery.retention``).

The names below are the public surface the console and the API use.
"""

from recovery.errors import BrokerUnavailable, ReplayError, StateError
from recovery.replay.curation import (
    discard_matching,
    discard_message,
    edit_and_replay,
    restore_matching,
    restore_message,
)
from recovery.replay.one import (
    REPLAYABLE,
    ConfirmingPublisher,
    claim,
    record_outcome,
    replay_message,
)
from recovery.replay.wire import STRIPPED_HEADERS, wire_message

__all__ = [
    "REPLAYABLE",
    "STRIPPED_HEADERS",
    "BrokerUnavailable",
    "ConfirmingPublisher",
    "ReplayError",
    "StateError",
    "claim",
    "discard_matching",
    "discard_message",
    "edit_and_replay",
    "record_outcome",
    "replay_message",
    "restore_matching",
    "restore_message",
    "wire_message",
]
