"""The job runner's database side: lease, snapshot, claims, outcomes — each one short transaction.

Written as SQL on a dedicated psycopg connection because it is the hot path of a bulk replay
(batches of hundreds of rows per statement, COPY for the attempt and activity rows).

Concurrency rules, the reason this module exists:

* One runner holds a job at a time: ``runner`` + ``heartbeat_at`` on the job row are its lease.
  Every write a runner makes is fenced with ``claimed_by = <runner>`` / ``runner = <runner>``, so
  a runner that lost its lease (a long pause, a network partition) cannot overwrite the work of
  the one that took over.
* Items are claimed with ``FOR UPDATE SKIP LOCKED``; claiming also locks the message rows (in id
  order, so two jobs never deadlock). The one-click replay, discard and restore lock the message
  row first too, and only then look for a job's claim; so whoever gets the lock second sees the
  other's committed work, and no message is ever claimed by two replays at once.
* A job's messages keep their status while it runs (only the outcome changes it): a status
  update rewrites every index of ``recovery_message``, so the hot path writes each message once.

What PostgreSQL spends per replayed message is most of a bulk replay's cost, so the writes are
kept lean: an item's updates touch no index (HOT, see ReplayJobItem), the attempt and activity
rows are COPYed and carry no database foreign keys to check row by row, and the message row is
locked once (claim) and updated once (outcome).
"""

import json
import logging

from recovery import db
from recovery.db import database_conninfo
from recovery.replay.claims import MESSAGE_COLUMNS, sort_claims

log = logging.getLogger(__name__)

JOB = "recovery_replayjob"
ITEM = "recovery_replayjobitem"
MESSAGE = "recovery_message"


def id_array(ids):
    """A bigint[] parameter as its text form: psycopg dumps a list element by element in
    Python, which costs more than the rest of a claim's parameters together."""
    return "{" + ",".join(map(str, ids)) + "}"


# The outcomes of one batch, in one statement (recovery.replay.job_store.JobStore.record). Items
# still claimed by this runner (the fence) take their outcome; a confirmed message becomes
# replayed (count + 1), one that was replayed before and fails now needs attention again
# (pending) and shows why; each written outcome gets its attempt and its activity row; the job
# counts what was written, and each a history row (recovery.models.history, ``who`` is the
# job's creator's username). ``nacked`` and ``failed`` both count as failed on the job.
RECORD_SQL = f"""
WITH d AS (
    -- [[item id, outcome, detail, exchange, routing key], ...]
    SELECT (r ->> 0)::bigint AS id, r ->> 1 AS outcome, r ->> 2 AS detail,
           r ->> 3 AS exchange, r ->> 4 AS routing_key
    FROM json_array_elements(%(rows)s::json) AS r
), mine AS (
    UPDATE {ITEM} i SET state = d.outcome, finished_at = now(),
           detail = CASE WHEN d.outcome = 'confirmed' THEN '' ELSE d.detail END
    FROM d WHERE i.id = d.id AND i.claimed_by = %(me)s AND i.state = 'claimed'
    RETURNING i.message_id, d.outcome, d.detail, d.exchange, d.routing_key
), messages AS (
    -- The rows are locked in id order, as claims lock them (a claim of another job may be
    -- waiting for some of them): in whatever order the join produced, two jobs could deadlock.
    UPDATE {MESSAGE} m SET updated_at = now(),
           status_reason = CASE WHEN s.outcome = 'confirmed' THEN '' ELSE s.detail END,
           status = CASE WHEN s.outcome = 'confirmed' THEN 'replayed'
                         WHEN m.status = 'replayed' THEN 'pending' ELSE m.status END,
           replay_count = m.replay_count + (s.outcome = 'confirmed')::int,
           last_replayed_at = CASE WHEN s.outcome = 'confirmed' THEN now()
                                   ELSE m.last_replayed_at END
    FROM (
        SELECT x.id, mine.outcome, mine.detail FROM {MESSAGE} x JOIN mine ON x.id = mine.message_id
        ORDER BY x.id FOR UPDATE OF x
    ) s
    WHERE m.id = s.id
    RETURNING m.id, m.message_id, m.vhost, m.source_queue, m.group_key, m.group_label
), history AS (
    -- What was done, kept after retention deletes the message (recovery.models.history).
    INSERT INTO recovery_messagehistory (message_id, store_id, vhost, queue, group_key,
        group_label, action, who, via, at, job_id, outcome, target_exchange,
        target_routing_key, detail)
    SELECT m.message_id, m.id, m.vhost, m.source_queue, m.group_key, m.group_label, 'replay',
           %(who)s::text, %(via)s::text, now(), %(job)s::bigint, mine.outcome, mine.exchange,
           mine.routing_key, mine.detail
    FROM mine JOIN messages m ON m.id = mine.message_id
), attempts AS (
    INSERT INTO recovery_replayattempt (message_id, job_id, user_id, exchange, routing_key,
                                        outcome, detail, edited, created_at)
    SELECT message_id, %(job)s::bigint, %(user)s::bigint, exchange, routing_key, outcome,
           detail, false, now()
    FROM mine
), activity AS (
    INSERT INTO recovery_activity (user_id, action, message_id, job_id, detail, via, created_at)
    SELECT %(user)s::bigint, 'replay', message_id, %(job)s::bigint,
           jsonb_build_object('message', message_id, 'exchange', exchange,
                              'routing_key', routing_key, 'outcome', outcome, 'detail', detail,
                              'edited', false, 'job', %(job)s::bigint),
           %(via)s::text, now()
    FROM mine
), counted AS (
    SELECT outcome, count(*) AS n FROM mine GROUP BY outcome
), job AS (
    UPDATE {JOB} SET
        sent = sent + (SELECT coalesce(sum(n), 0) FROM counted),
        confirmed = confirmed + (SELECT coalesce(sum(n), 0) FROM counted
                                 WHERE outcome = 'confirmed'),
        returned = returned + (SELECT coalesce(sum(n), 0) FROM counted
                               WHERE outcome = 'returned'),
        failed = failed + (SELECT coalesce(sum(n), 0) FROM counted
                           WHERE outcome IN ('nacked', 'failed'))
    WHERE id = %(job)s::bigint
)
SELECT outcome, n FROM counted
"""


class JobStore:
    def __init__(self, job_id, runner_id, conninfo=None):
        self.job_id = job_id
        self.runner_id = runner_id
        self.conninfo = conninfo or database_conninfo("lazarus-replay")
        self.pg = None
        self.previous_runner = None
        # Claims walk the job's pending items upwards from here (see claim).
        self.cursor = 0
        self._username = (None, "")  # (user id, its username): see username()

    def connect(self):
        if self.pg is None or self.pg.closed:
            self.pg = db.connect(self.conninfo, autocommit=True)
            # Losing the last few hundred milliseconds of commits to a PostgreSQL crash costs
            # only duplicates here (claimed-but-unrecorded items are sent again, within the
            # window), never a lost message; waiting for each WAL flush costs throughput.
            # Behind a transaction-mode pooler the SET would land on a shared server
            # connection: skipped (commits then wait for the WAL flush).
            if db.session_state_allowed():
                self.pg.execute("SET synchronous_commit = off")
        return self.pg

    def close(self):
        if self.pg is not None and not self.pg.closed:
            self.pg.close()
        self.pg = None

    def execute(self, sql, params=()):
        return self.connect().execute(sql, params)

    # ---- the lease ------------------------------------------------------------------------

    def acquire(self, token, lease_seconds):
        """Take the job if it is queued/running and nobody holds a live lease.

        On success ``self.previous_runner`` is the runner whose lease this replaces ('' when the
        job was free), so the caller can tell a takeover after a crash from a fresh start.
        """
        row = self.execute(
            f"""
            UPDATE {JOB} SET runner = %(me)s, heartbeat_at = now(), state = 'running',
                   started_at = coalesce(started_at, now()), finished_at = NULL
            FROM (SELECT runner AS previous FROM {JOB} WHERE id = %(id)s FOR UPDATE) prev
            WHERE id = %(id)s AND (%(token)s::uuid IS NULL OR token = %(token)s::uuid)
              AND state IN ('queued', 'running')
              AND (runner = '' OR heartbeat_at IS NULL
                   OR heartbeat_at < now() - make_interval(secs => %(lease)s))
            RETURNING prev.previous
            """,
            {"me": self.runner_id, "id": self.job_id, "token": token, "lease": lease_seconds},
        ).fetchone()
        self.previous_runner = row[0] if row is not None else None
        return row is not None

    def peek(self):
        """(state, runner, token) or None if the job is gone."""
        return self.execute(
            f"SELECT state, runner, token::text FROM {JOB} WHERE id = %s", (self.job_id,)
        ).fetchone()

    def heartbeat(self, in_flight, dead_again, reason):
        """Renew the lease; the job's state, or None if another runner took it over."""
        row = self.execute(
            f"""
            UPDATE {JOB} SET heartbeat_at = now(), in_flight = %s,
                   dead_again = greatest(dead_again, %s),
                   state_reason = CASE WHEN state = 'running' THEN %s ELSE state_reason END
            WHERE id = %s AND runner = %s
            RETURNING state
            """,
            (in_flight, dead_again, reason, self.job_id, self.runner_id),
        ).fetchone()
        return row[0] if row else None

    def end(self, state, reason, from_states=("running",)):
        """Leave the job in ``state`` (None = keep it) and give up the lease; True if ours."""
        row = self.execute(
            f"""
            UPDATE {JOB} SET runner = '', in_flight = 0,
                   state = CASE WHEN state = ANY(%(from)s) AND %(state)s::text IS NOT NULL
                                THEN %(state)s ELSE state END,
                   state_reason = CASE WHEN state = ANY(%(from)s) AND %(state)s::text IS NOT NULL
                                THEN %(reason)s ELSE state_reason END,
                   finished_at = CASE WHEN %(state)s IN ('done', 'failed', 'cancelled')
                                      AND state = ANY(%(from)s) THEN now() ELSE finished_at END
            WHERE id = %(id)s AND runner = %(me)s
            RETURNING state
            """,
            {
                "state": state,
                "reason": reason,
                "from": list(from_states),
                "id": self.job_id,
                "me": self.runner_id,
            },
        ).fetchone()
        return row[0] if row else None

    def set_fields(self, **fields):
        assignments = ", ".join(f"{name} = %({name})s" for name in fields)
        self.execute(
            f"UPDATE {JOB} SET {assignments} WHERE id = %(_id)s AND runner = %(_me)s",
            {**fields, "_id": self.job_id, "_me": self.runner_id},
        )

    # ---- the snapshot -----------------------------------------------------------------------

    def populate(self, selection_sql, selection_params, canary_size):
        """Snapshot the job's messages as items, once; returns the total.

        Runs on Django's connection: ``selection_sql`` is a Django queryset's SQL, whose
        parameters that connection knows how to bind. The job row's lock and ``populated_at``
        make it happen once; no ON CONFLICT clause (a speculative insertion per item cost a
        third of the snapshot): job_item_unique would refuse a second copy loudly.
        """
        from django.db import connection, transaction

        with transaction.atomic(), connection.cursor() as cur:
            cur.execute(
                f"SELECT populated_at IS NOT NULL, total FROM {JOB} "
                "WHERE id = %s AND runner = %s FOR UPDATE",
                (self.job_id, self.runner_id),
            )
            row = cur.fetchone()
            if row is None or row[0]:
                return row[1] if row else 0
            cur.execute(
                f"""
                INSERT INTO {ITEM} (job_id, message_id, state, canary, snapshot_replay_count,
                                    claimed_by, detail)
                SELECT %s, s.id, 'pending', row_number() OVER (ORDER BY s.id) <= %s,
                       s.replay_count, '', ''
                FROM ({selection_sql}) AS s (id, replay_count)
                """,
                (self.job_id, canary_size, *selection_params),
            )
            cur.execute(f"SELECT count(*) FROM {ITEM} WHERE job_id = %s", (self.job_id,))
            total = cur.fetchone()[0]
            cur.execute(
                f"UPDATE {JOB} SET total = %s, populated_at = now() WHERE id = %s",
                (total, self.job_id),
            )
        with connection.cursor() as cur:
            # The claim and breaker queries plan on these statistics; a big snapshot changes
            # them more than autovacuum notices in time.
            cur.execute(f"ANALYZE {ITEM}")
        return total

    def rewind(self):
        """Claim from the job's first pending item again (after items were given back)."""
        self.cursor = 0

    def reclaim(self):
        """Items a stopped runner left claimed go back to pending; how many."""
        return self.execute(
            f"""
            UPDATE {ITEM} SET state = 'pending', claimed_by = '', claimed_at = NULL
            WHERE job_id = %s AND state = 'claimed' AND claimed_by <> %s
            """,
            (self.job_id, self.runner_id),
        ).rowcount

    # ---- claims and outcomes ------------------------------------------------------------------

    def claim(self, limit, allowed_statuses, canary_only=False):
        """Claim up to ``limit`` pending items; (claimed list, skipped count, any_left).

        Items are claimed in id order from ``self.cursor`` on, not from the job's first pending
        item: the index on (job, id) holds every item of the job, done or not, so starting over
        each time would re-walk all that were sent (quadratic in the job's size). ``any_left``
        is False once nothing pending lies above the cursor; items given back below it
        (``release``) are found after ``rewind``.
        """
        pg = self.connect()
        with pg.transaction():
            items = pg.execute(
                f"""
                SELECT id, message_id, snapshot_replay_count FROM {ITEM}
                WHERE job_id = %s AND state = 'pending' AND id > %s
                      {"AND canary" if canary_only else ""}
                ORDER BY id LIMIT %s
                FOR UPDATE SKIP LOCKED
                """,
                (self.job_id, self.cursor, limit),
            ).fetchall()
            if not items:
                return [], 0, False
            self.cursor = items[-1][0]
            message_ids = [m for _i, m, _s in items]
            rows = {
                row[0]: row
                # Binary results: a body comes as its bytes, not as hex text twice its size
                # that PostgreSQL encodes and psycopg decodes (6.5 -> 3.5-4 us per 1 KiB row).
                for row in pg.execute(
                    f"SELECT {MESSAGE_COLUMNS} FROM {MESSAGE} WHERE id = ANY(%s::bigint[]) "
                    "ORDER BY id FOR UPDATE",
                    (id_array(message_ids),),
                    binary=True,
                ).fetchall()
            }
            held = dict(
                pg.execute(
                    f"SELECT message_id, job_id FROM {ITEM} "
                    "WHERE message_id = ANY(%s::bigint[]) AND state = 'claimed' AND job_id <> %s",
                    (id_array(message_ids), self.job_id),
                ).fetchall()
            )
            claimed, skipped = sort_claims(items, rows, held, allowed_statuses)
            self._mark_claimed(pg, claimed, skipped)
            return claimed, len(skipped), True

    def _mark_claimed(self, pg, claimed, skipped):
        if claimed:
            pg.execute(
                f"UPDATE {ITEM} SET state = 'claimed', claimed_by = %s, claimed_at = now() "
                "WHERE id = ANY(%s::bigint[])",
                (self.runner_id, id_array([c.item_id for c in claimed])),
            )
        if skipped:
            pg.execute(
                f"""
                UPDATE {ITEM} i SET state = 'skipped', detail = d.detail, finished_at = now()
                FROM unnest(%s::bigint[], %s::text[]) AS d (id, detail) WHERE i.id = d.id
                """,
                (list(skipped), list(skipped.values())),
            )
            pg.execute(
                f"UPDATE {JOB} SET skipped = skipped + %s WHERE id = %s",
                (len(skipped), self.job_id),
            )

    def skip(self, skipped):
        """Claimed items this runner will not send ({item id: why}): skipped with the reason
        (the fence: only items it still holds), and counted on the job."""
        if not skipped:
            return 0
        pg = self.connect()
        with pg.transaction():
            done = pg.execute(
                f"""
                UPDATE {ITEM} i SET state = 'skipped', detail = d.detail, finished_at = now(),
                       claimed_by = ''
                FROM unnest(%s::bigint[], %s::text[]) AS d (id, detail)
                WHERE i.id = d.id AND i.claimed_by = %s AND i.state = 'claimed'
                """,
                (list(skipped), list(skipped.values()), self.runner_id),
            ).rowcount
            pg.execute(
                f"UPDATE {JOB} SET skipped = skipped + %s WHERE id = %s AND runner = %s",
                (done, self.job_id, self.runner_id),
            )
        return done

    def record(self, results, user_id, via):
        """Write outcomes: results are (item_id, message_id, outcome, detail, exchange, key).

        Only items this runner still holds are written (the fence); returns the counts written.
        One statement per batch: the items, their messages, an attempt and an activity row each
        (all stamped with the transaction's now()), and the job's counters.
        """
        counts = {"confirmed": 0, "returned": 0, "nacked": 0, "failed": 0}
        if not results:
            return counts
        # One JSON parameter: psycopg would dump five lists element by element in Python.
        rows = json.dumps([(r[0], r[2], r[3], r[4], r[5]) for r in results])
        written = (
            self.connect()
            .execute(
                RECORD_SQL,
                {
                    "rows": rows,
                    "me": self.runner_id,
                    "job": self.job_id,
                    "user": user_id,
                    "who": self.username(user_id),
                    "via": via,
                },
            )
            .fetchall()
        )
        for outcome, n in written:
            counts[outcome] += n
        return counts

    def username(self, user_id):
        """The username of ``user_id`` ('' for none, or a user deleted since), looked up once:
        the history keeps the name, which outlives the user."""
        if user_id is None:
            return ""
        if self._username[0] != user_id:
            from django.contrib.auth import get_user_model

            model = get_user_model()
            row = self.execute(
                f"SELECT {model._meta.get_field(model.USERNAME_FIELD).column} "
                f"FROM {model._meta.db_table} "
                f"WHERE {model._meta.pk.column} = %s",
                (user_id,),
            ).fetchone()
            self._username = (user_id, row[0] if row is not None else "")
        return self._username[1]

    def release(self, item_ids, detail=""):
        """Claimed items go back to pending (not sent, or their outcome is unknown)."""
        if not item_ids:
            return 0
        return self.execute(
            f"""
            UPDATE {ITEM} SET state = 'pending', claimed_by = '', claimed_at = NULL, detail = %s
            WHERE id = ANY(%s) AND claimed_by = %s AND state = 'claimed'
            """,
            (detail, list(item_ids), self.runner_id),
        ).rowcount

    # ---- what came back -------------------------------------------------------------------------

    def dead_again(self, started_at, canary_only=False):
        """How many of the job's confirmed messages were dead-lettered again (collected with
        ``origin`` = the replayed message) since the job started."""
        return self.execute(
            f"""
            SELECT count(DISTINCT m.origin_id) FROM {MESSAGE} m
            WHERE m.collected_at >= %s AND m.origin_id IS NOT NULL AND EXISTS (
                SELECT 1 FROM {ITEM} i
                WHERE i.job_id = %s AND i.message_id = m.origin_id AND i.state = 'confirmed'
                  {"AND i.canary" if canary_only else ""})
            """,
            (started_at, self.job_id),
        ).fetchone()[0]

    def canary_elapsed(self):
        """Seconds since the canary finished (stamping that moment the first time)."""
        self.execute(
            f"UPDATE {JOB} SET canary_sent_at = now() "
            "WHERE id = %s AND runner = %s AND canary_sent_at IS NULL",
            (self.job_id, self.runner_id),
        )
        return float(
            self.execute(
                f"SELECT extract(epoch FROM now() - canary_sent_at) FROM {JOB} WHERE id = %s",
                (self.job_id,),
            ).fetchone()[0]
        )

    def canary_counts(self):
        """{state: count} of the canary items."""
        return dict(
            self.execute(
                f"SELECT state, count(*) FROM {ITEM} WHERE job_id = %s AND canary GROUP BY state",
                (self.job_id,),
            ).fetchall()
        )

    def reconcile(self):
        """Set the job's counters from its items (the items are the truth); the counts."""
        counts = dict(
            self.execute(
                f"SELECT state, count(*) FROM {ITEM} WHERE job_id = %s GROUP BY state",
                (self.job_id,),
            ).fetchall()
        )
        answered = sum(counts.get(s, 0) for s in ("confirmed", "returned", "nacked", "failed"))
        self.execute(
            f"""
            UPDATE {JOB} SET total = %s, sent = %s, confirmed = %s, returned = %s, failed = %s,
                   skipped = %s
            WHERE id = %s AND runner = %s
            """,
            (
                sum(counts.values()),
                answered,
                counts.get("confirmed", 0),
                counts.get("returned", 0),
                counts.get("nacked", 0) + counts.get("failed", 0),
                counts.get("skipped", 0),
                self.job_id,
                self.runner_id,
            ),
        )
        return counts
