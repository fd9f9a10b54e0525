"""What a replay job claims, and the thread that claims it.

A claim (``JobStore.claim``) locks a batch of a job's pending items and their messages, sorts
them against the messages' rows now (``sort_claims``: still there, not held by another job, a
status the job may replay, not replayed since the snapshot) and hands the runner ``Claimed``
rows, each with what it needs to publish. ``Claims`` runs them on a thread of its own so the
runner's loop goes on meanwhile.
"""

import json
from concurrent.futures import ThreadPoolExecutor

from recovery.replay.wire import STRIPPED_HEADERS

# Headers a replay strips (x-death above all, the biggest a dead letter has) are dropped by
# PostgreSQL: never sent to the runner, never decoded there.
_STRIPPED_ARRAY = "'{" + ",".join(f'"{name}"' for name in STRIPPED_HEADERS) + "}'::text[]"
# The JSON a replay needs (the first routing key, the properties, the headers) comes as one JSON
# text: one decode per message in the runner instead of three.
MESSAGE_COLUMNS = (
    "id, status, replay_count, kind, vhost, source_queue, source_exchange, "
    f"jsonb_build_array(routing_keys -> 0, properties, headers - {_STRIPPED_ARRAY})::text, body"
)
_decode_json = json.JSONDecoder().decode


class Claimed:
    """One claimed message, as the runner needs it to publish."""

    __slots__ = (
        "item_id",
        "message_id",
        "replay_count",
        "kind",
        "vhost",
        "source_queue",
        "source_exchange",
        "routing_keys",
        "properties",
        "headers",
        "body",
    )

    def __init__(self, item_id, row):
        self.item_id = item_id
        (
            self.message_id,
            _status,
            self.replay_count,
            self.kind,
            self.vhost,
            self.source_queue,
            self.source_exchange,
            wire_json,
            self.body,
        ) = row
        # Only the first routing key is ever a target (default_target_of).
        first_key, self.properties, self.headers = _decode_json(wire_json)
        self.routing_keys = [] if first_key is None else [first_key]


def sort_claims(items, rows, held, allowed_statuses):
    """Pending items against their messages' rows now: (claimed, {item id: why skipped})."""
    claimed, skipped = [], {}
    for item_id, message_id, snapshot in items:
        row = rows.get(message_id)
        if row is None:  # deleted by raw SQL (Django deletes a message's items with it)
            skipped[item_id] = "skipped: the message no longer exists"
        elif message_id in held:
            skipped[item_id] = f"skipped: held by job #{held[message_id]}"
        elif row[1] not in allowed_statuses:
            skipped[item_id] = f"skipped: the message is {row[1]} now"
        elif row[2] != snapshot:
            skipped[item_id] = "skipped: replayed by someone else since the job was created"
        else:
            claimed.append(Claimed(item_id, row))
    return claimed, skipped


class Claims:
    """Claims on a thread of their own, one at a time, with their own JobStore (connection).

    ``start`` hands a claim to the thread; ``done`` says whether its answer is there; ``result``
    returns it (or raises what the claim raised). The store's cursor (where the next claim
    starts) lives here: ``rewind`` only while no claim runs.
    """

    def __init__(self, store, wakeup):
        self.store, self.wakeup = store, wakeup
        self.executor = ThreadPoolExecutor(1, thread_name_prefix=f"replay-claims:{store.job_id}")
        self.future = None

    @property
    def running(self):
        return self.future is not None

    def start(self, limit, allowed_statuses, canary_only):
        self.future = self.executor.submit(self.store.claim, limit, allowed_statuses, canary_only)
        self.future.add_done_callback(lambda _future: self.wakeup.set())

    def done(self):
        return self.future is not None and self.future.done()

    def result(self):
        """(claimed, skipped, any_left) of the claim that ran; waits for it."""
        future, self.future = self.future, None
        return future.result()

    def rewind(self):
        assert self.future is None, "rewind while a claim runs"
        self.store.rewind()

    def close(self):
        self.executor.shutdown(wait=True)
        self.store.close()
