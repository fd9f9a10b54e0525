"""Runs one bulk replay job: claim, pace, publish with confirms, record — until done or stopped.

The loop (``JobRunner.run``), in one thread beside the publishers' I/O threads:

1. take the job's lease (waiting out a crashed runner's), snapshot its messages as items once,
   and put back what a crashed runner left claimed;
2. claim a batch of items (``FOR UPDATE SKIP LOCKED``), build each message's wire form and hand
   it to the publisher of its vhost at the job's rate (a token bucket) or as fast as the window
   allows;
3. write outcomes in batches (only items still held: the fence), heartbeat every half second,
   read the job's state (cancelled? paused?) and run the circuit breaker;
4. with a canary, claim only the canary items first, wait the pause, judge, then go on.

Never more than ``window`` messages are sent and not yet recorded: that is what a crash (or a
kill -9) can duplicate, because a new runner re-sends whatever was claimed and unrecorded. One
more claim batch may wait, claimed but unsent, so the next claim's round trip to PostgreSQL
overlaps with publishing; re-sending those after a crash sends them once.

Claims run on a thread of their own (``recovery.replay.claims.Claims``, its own database
connection): a claim of a few hundred rows takes milliseconds of PostgreSQL, and the loop goes
on collecting outcomes and handing them to the recorders meanwhile instead of letting the window
fill up behind it.
"""

import logging
import os
import socket
import threading
import time
import uuid
from collections import deque

import psycopg
from django.conf import settings
from django.utils import timezone

from recovery.broker.codec import unpublishable
from recovery.models import Activity, ReplayJob, Role
from recovery.replay.authority import AUTHORITY_CHECK_S, LEFT_SCOPE, ItemCheck, job_authority
from recovery.replay.claims import Claims
from recovery.replay.job_store import JobStore
from recovery.replay.pacer import Pacer
from recovery.replay.publisher import AsyncPublisher, Entry
from recovery.replay.recorder import RECORDERS, Recorder, Recorders
from recovery.replay.safety import breaker_reason, canary_reason
from recovery.replay.selection import job_queryset, scope_at_creation, selection_sql
from recovery.replay.targets import Target, delay_name, delay_route_problem
from recovery.replay.wire import wire_from_columns

log = logging.getLogger(__name__)

# Heartbeat + state check period: how fast a cancel or a pause takes effect.
CONTROL_S = 0.5
# Outcomes are written at least this often, and in batches of at most FLUSH_ROWS. Small and
# often: a message counts against the window until its outcome is written, so at full speed
# the time from publish to record, not CPU, is what bounds a job (window / that time).
FLUSH_S = 0.01
FLUSH_ROWS = 100
# The circuit breaker counts what came back at most this often (a join over the job's items)
# once its sample is full; before, at every control tick (JobRunner._breaker_check_s).
BREAKER_CHECK_S = 2.0
# How long the publisher may be disconnected before the job says it is waiting for RabbitMQ.
BROKER_QUIET_S = 2.0
# A slow rate must not hold a worker while it waits: when the next message may go no sooner than
# this, with nothing in flight, the runner settles, hands the job back (queued) and sends its
# task again with a countdown; the worker runs other tasks meanwhile (rate 0.001/s held a worker
# for 1,000 s per message).
RATE_YIELD_S = 5.0
# Set by the Celery worker_shutting_down signal (recovery.replay.tasks): runners hand their job
# back.
SHUTDOWN = threading.Event()


class LeaseLost(Exception):
    """Another runner took the job over; stop without writing anything."""


def runner_name():
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class JobRunner:
    def __init__(
        self,
        job_id,
        token=None,
        *,
        runner_id=None,
        window=None,
        claim_batch=None,
        lease_seconds=None,
        confirm_timeout=None,
        broker_url=None,
        conninfo=None,
        paced=False,
    ):
        self.job_id = job_id
        # Started by its own countdown after a rate wait (RATE_YIELD_S): the next message is due.
        self.paced = paced
        self.token = str(token) if token else None
        self.runner_id = runner_id or runner_name()
        self.window = window or settings.REPLAY_WINDOW
        self.claim_batch = claim_batch or settings.REPLAY_CLAIM_BATCH
        self.lease_seconds = lease_seconds or settings.REPLAY_LEASE_SECONDS
        self.confirm_timeout = confirm_timeout or settings.REPLAY_CONFIRM_TIMEOUT_SECONDS
        self.broker_url = broker_url
        self.store = JobStore(job_id, self.runner_id, conninfo)
        self.wakeup = threading.Event()
        self.claims = None
        self.publishers = {}
        self.declared_delays = set()
        self.job = None
        self.recorder = None
        self.dead = 0
        self.confirmed_before = 0
        self.last_breaker_check = 0.0
        self.last_authority_check = 0.0
        self.disconnected_since = None

    # ---- entry point ----------------------------------------------------------------------

    def run(self, wait_for_lease=True):
        """Run the job to its end or a stop; returns what happened: ``done``, ``paused``,
        ``cancelled``, ``requeued`` (worker shutdown), ``sleeping`` (a slow rate: sent again
        with a countdown, see RATE_YIELD_S), ``failed``, ``stopped`` (its creator lost the
        right to send it: cancelled with the reason, recovery.replay.authority), ``lost``
        (lease taken over), ``busy`` (another live runner has it) or ``gone`` (not
        runnable)."""
        try:
            first_start = not ReplayJob.objects.filter(
                pk=self.job_id, started_at__isnull=False
            ).exists()
            acquired = self._acquire(wait_for_lease)
            if acquired != "ok":
                return acquired
            try:
                self.job = ReplayJob.objects.get(pk=self.job_id)
                self._prepare(first_start)
                return self._loop()
            except LeaseLost:
                log.warning("replay job %s: lease taken over by another runner", self.job_id)
                return "lost"
            except psycopg.OperationalError as exc:
                # The database went away: nothing can be recorded, so stop as a crash would.
                # The job keeps this runner's (now stale) lease; resume_stalled_jobs hands it
                # to a new runner, which re-sends what was claimed and not recorded.
                log.error("replay job %s interrupted, database unavailable: %s", self.job_id, exc)
                return "interrupted"
            except Exception as exc:
                log.exception("replay job %s failed", self.job_id)
                self._fail(exc)
                return "failed"
        finally:
            for publisher in self.publishers.values():
                publisher.close()
            if self.recorder is not None:
                self.recorder.stop()
            if self.claims is not None:
                self.claims.close()
            self.store.close()

    def _acquire(self, wait):
        deadline = time.monotonic() + (self.lease_seconds + 2 if wait else 0)
        while True:
            if self.store.acquire(self.token, self.lease_seconds):
                return "ok"
            peek = self.store.peek()
            if peek is None or peek[0] not in (ReplayJob.State.QUEUED, ReplayJob.State.RUNNING):
                return "gone"
            if self.token is not None and peek[2] != self.token:
                log.warning("replay job %s: the task's token is not the job's", self.job_id)
                return "gone"
            if time.monotonic() >= deadline:
                return "busy"
            time.sleep(min(1.0, self.lease_seconds / 4))

    def _count_out_of_scope(self, job):
        """A team's job sends only what is in the team's scope when it runs: the messages it
        selected that have left it since are not sent, and said so in the activity log.

        Counted only among what the team could see when the job was made (the scope recorded
        in its ``job_created`` row), never over the whole store: a count of whatever else
        matches would tell the team how many of another team's messages a filter or a list of
        guessed ids hits. A job made before scopes were recorded counts nothing."""
        then = scope_at_creation(job)
        if then is None:
            return
        now = self.authority.scope.q(Role.OPERATOR)
        left_out = job_queryset(job).filter(then).exclude(now).count()
        if left_out > 0:
            log.warning("replay job %s: %s messages out of its team's scope", job.pk, left_out)
            Activity.record(
                None,
                "job_out_of_scope",
                detail={"left_out": left_out, "team": job.team_id},
                via="system",
                job=self.job_id,
            )

    def _prepare(self, first_start):
        job = self.job
        if first_start:
            Activity.record(
                None,
                "job_started",
                detail={"runner": self.runner_id},
                via="system",
                job=self.job_id,
            )
        # Who the job sends for, now (a resume, a requeue or a takeover starts here): a creator
        # who lost the right gets no snapshot; the first control tick stops the job.
        self._check_authority()
        if job.populated_at is None and not self.authority.refusal:
            sql, params = selection_sql(job)
            job.total = self.store.populate(sql, params, job.canary_size)
            log.info("replay job %s: %s messages", job.pk, job.total)
            if job.team_id is not None:
                self._count_out_of_scope(job)
        reclaimed = self.store.reclaim()
        previous = self.store.previous_runner
        if reclaimed or (previous and previous != self.runner_id):
            # A crashed runner's lease expired: say so even when it died between two claims
            # and left nothing to re-send.
            log.warning(
                "replay job %s: took over from %r, %s claimed messages", job.pk, previous, reclaimed
            )
            Activity.record(
                None,
                "job_taken_over",
                detail={"runner": self.runner_id, "previous": previous, "reclaimed": reclaimed},
                via="system",
                job=self.job_id,
            )
        self.target = Target.of_job(job)
        self.user_id = job.created_by_id
        self.replayed_by = job.created_by.get_username() if job.created_by_id else "lazarus"
        self.confirmed_before = job.confirmed
        self.dead = job.dead_again
        self.recorder = Recorders(
            [
                Recorder(
                    JobStore(job.pk, self.runner_id, self.store.conninfo),
                    self.user_id,
                    job.via,
                    self.wakeup,
                )
                for _ in range(RECORDERS)
            ]
        )
        self.claims = Claims(JobStore(job.pk, self.runner_id, self.store.conninfo), self.wakeup)
        self.breaker_pct = job.breaker_threshold_pct or 0
        self.canary = job.canary_size > 0 and job.canary_passed_at is None

    # ---- the loop ---------------------------------------------------------------------------

    def _loop(self):
        # (vhost, Entry, Claimed): claimed, not yet handed to a publisher
        self.buffer = deque()
        self.pending = {}  # item id -> (message id, exchange, key): handed over, not answered
        self.results = []  # answered, not yet handed to a recorder
        self.exhausted = False  # no pending item left to claim (in this phase)
        self.canary_until = None
        self.pacer = Pacer(self.job.rate, tokens=1.0 if self.paced else 0.0)
        next_control = last_flush = 0.0
        while True:
            self.wakeup.clear()
            now = time.monotonic()
            if now >= next_control:
                self._flush()
                verdict = self._control()
                if verdict is not None:
                    return self._stop(verdict)
                next_control = now + CONTROL_S
            if self.claims.done():
                self._staged_claim()
            if self._may_claim():
                self._claim()
            room = max(0, self.window - self.sent_unrecorded)
            for _ in range(self.pacer.allowance(now, min(len(self.buffer), room))):
                vhost, entry, _claimed = self.buffer.popleft()
                self._publisher(vhost).submit(entry)
            self._collect()
            if self.results and (len(self.results) >= FLUSH_ROWS or now - last_flush >= FLUSH_S):
                self._flush()
                last_flush = now
            if self.exhausted and not self.buffer and not self.pending and not self.claims.running:
                ended = self._phase_end()
                if ended is not None:
                    return ended
                continue
            if self.buffer and self.pacer.rate:
                wait = self.pacer.wait()
                # Nothing handed to a publisher is unanswered (pending = buffer + in flight).
                idle = len(self.pending) == len(self.buffer) and not self.claims.running
                if wait > RATE_YIELD_S and idle:
                    return self._stop(("sleep", wait))
                self.wakeup.wait(min(wait, 0.05))
            elif self.buffer:
                self.wakeup.wait(0.05)  # the window is full: for outcomes or the recorders
            elif not self._may_claim():
                self.wakeup.wait(0.05)  # for a claim, outcomes, the recorders, a stalled broker

    @property
    def unrecorded(self):
        """Claimed and not yet written (<= window + claim_batch). ``pending`` includes the
        buffer."""
        return len(self.pending) + len(self.results) + self.recorder.backlog

    @property
    def sent_unrecorded(self):
        """Handed to a publisher and not yet written: what a crash now could send twice (kept
        <= window)."""
        return self.unrecorded - len(self.buffer)

    def _may_claim(self):
        return (
            not self.exhausted
            and not self.claims.running
            and not self.buffer
            and self.canary_until is None
            and self.unrecorded < self.window + self.claim_batch
        )

    def _claim(self):
        """Start the next claim on the claims thread (its answer is staged by _staged_claim)."""
        limit = min(self.claim_batch, self.window + self.claim_batch - self.unrecorded)
        self.claims.start(limit, self.job.allowed_statuses, self.canary)

    def _staged_claim(self):
        claimed, _skipped, any_left = self.claims.result()
        self.exhausted = not any_left
        self._stage(claimed)

    def _running_claim_items(self):
        """The item ids of a claim still running, once it is done (the job is stopping)."""
        if self.claims is None or not self.claims.running:
            return []
        claimed, _skipped, _any_left = self.claims.result()
        return [c.item_id for c in claimed]

    def _collect(self):
        pending, results = self.pending, self.results
        for publisher in self.publishers.values():
            for outcome in publisher.take_outcomes():
                message_id, exchange, key = pending.pop(outcome.key)
                results.append(
                    (outcome.key, message_id, outcome.outcome, outcome.detail, exchange, key)
                )

    def _phase_end(self):
        """Everything claimable was sent and answered: judge the canary, or finish. A stop
        verdict's outcome, or None to go on."""
        self._settle()
        if not self.canary:
            left = self.store.reconcile()
            if not (left.get("pending") or left.get("claimed")):
                return self._finish(left)
            if left.get("claimed"):
                # Nothing of ours is in flight now, so these were claimed by a runner that had
                # lost the lease (a long pause) after this one took over: they go again.
                reclaimed = self.store.reclaim()
                log.warning(
                    "replay job %s: %s items a deposed runner claimed", self.job_id, reclaimed
                )
            self.claims.rewind()  # what is left lies below the cursor
            self.exhausted = False
            return None
        if self.canary_until is None:
            remaining = self.job.canary_pause_seconds - self.store.canary_elapsed()
            self.canary_until = time.monotonic() + max(0.0, remaining)
        if time.monotonic() < self.canary_until:
            self.wakeup.wait(0.05)  # the canary's pause (heartbeats and cancels go on)
            return None
        verdict = self._judge_canary()
        if verdict is not None:
            return self._stop(verdict)
        self.canary, self.exhausted, self.canary_until = False, False, None
        self.claims.rewind()  # the rest of the job, from its first item
        return None

    def _stage(self, claimed):
        """Claimed rows -> wire entries in the buffer (a delay route is declared by the
        publisher before the first entry to it is published). What the creator may no longer
        send is skipped (recovery.replay.authority)."""
        target, pending, buffer = self.target, self.pending, self.buffer
        now = timezone.now().replace(tzinfo=None)
        skipped = {}
        sendable = []
        for c in claimed:
            why = self.item_check.why_not(c)
            if why is None:
                sendable.append(c)
            else:
                skipped[c.item_id] = why
        finals = [
            target.final(c.kind, c.source_queue, c.source_exchange, c.routing_keys)
            for c in sendable
        ]
        refused = self._want_delay_routes(sendable, finals)
        for c, (final_exchange, final_key) in zip(sendable, finals, strict=True):
            exchange, key = target.route(final_exchange, final_key)
            properties, body = wire_from_columns(
                c.message_id, c.properties, c.headers, c.body, c.replay_count, self.replayed_by, now
            )
            problem = refused.get((c.vhost, final_exchange)) or unpublishable(properties)
            if problem is not None:
                # Never sent, never retried: failed with its reason, and the job goes on.
                self.results.append(
                    (c.item_id, c.message_id, "failed", problem, final_exchange, final_key)
                )
                continue
            buffer.append(
                (c.vhost, Entry(c.item_id, exchange, key, properties, body, c.message_id), c)
            )
            pending[c.item_id] = (c.message_id, final_exchange, final_key)
        if skipped:
            self._skip(skipped)

    def _want_delay_routes(self, claimed, finals):
        """Have the publishers declare the delay routes these messages need, on the channel
        they publish them on (Khepri, 4.2+); {(vhost, final exchange): why not} for a route
        that cannot exist (its name would be longer than AMQP allows)."""
        seconds = self.target.delay_seconds
        if not seconds:
            return {}
        refused = {}
        needed = {(c.vhost, f[0]) for c, f in zip(claimed, finals, strict=True)}
        for vhost, final_exchange in needed - self.declared_delays:
            problem = delay_route_problem(seconds, final_exchange)
            if problem:
                refused[(vhost, final_exchange)] = f"no delay route: {problem}"
                continue
            name = delay_name(seconds, final_exchange)
            self._publisher(vhost).want_route(name, seconds, final_exchange)
            self.declared_delays.add((vhost, final_exchange))
        return refused

    def _skip(self, skipped):
        """Claimed items the creator may no longer send (recovery.replay.authority): never
        sent, each skipped with its reason, counted in the activity log by reason. The
        messages themselves are not touched (no status, no reason, no history row): they may
        be another team's by now."""
        self.store.skip(skipped)
        counts = {}
        for why in skipped.values():
            counts[why] = counts.get(why, 0) + 1
        log.warning("replay job %s: skipped %s", self.job_id, counts)
        left = counts.pop(LEFT_SCOPE, 0)
        if left:
            Activity.record(
                None,
                "job_out_of_scope",
                detail={"left_out": left, "team": self.job.team_id, "at": "claim"},
                via="system",
                job=self.job_id,
            )
        for why, n in counts.items():
            Activity.record(
                None,
                "job_items_skipped",
                detail={"skipped": n, "reason": why},
                via="system",
                job=self.job_id,
            )

    def _publisher(self, vhost):
        publisher = self.publishers.get(vhost)
        if publisher is None:
            publisher = AsyncPublisher(
                vhost,
                self.window,
                self.confirm_timeout,
                name=f"lazarus-replay job {self.job_id}",
                url=self.broker_url,
                wakeup=self.wakeup,
            )
            self.publishers[vhost] = publisher
        return publisher

    def _flush(self):
        if self.results:
            self.recorder.put(self.results)
            self.results = []

    def _settle(self):
        """Everything answered is written (before judging, pausing or finishing)."""
        self._flush()
        self.recorder.wait_idle()

    @property
    def confirmed(self):
        return self.confirmed_before + self.recorder.confirmed

    # ---- control: heartbeat, state, breaker ------------------------------------------------

    def _check_authority(self):
        self.authority = job_authority(self.job)
        self.item_check = ItemCheck(self.job, self.authority)
        self.last_authority_check = time.monotonic()
        buffer = getattr(self, "buffer", None)
        if buffer and not self.authority.refusal:
            self._recheck_buffer()

    def _recheck_buffer(self):
        """What waits in the buffer was checked when it was claimed; at a slow rate that can be
        minutes ago. Checked again with the rights as they are now."""
        keep, skipped = deque(), {}
        for staged in self.buffer:
            why = self.item_check.why_not(staged[2])
            if why is None:
                keep.append(staged)
            else:
                skipped[staged[1].key] = why
                self.pending.pop(staged[1].key, None)
        if skipped:
            self.buffer = keep
            self._skip(skipped)

    def _control(self):
        """Heartbeat; a stop verdict (kind, reason) or None to go on."""
        now = time.monotonic()
        if now - self.last_authority_check >= AUTHORITY_CHECK_S:
            self._check_authority()
        if self.authority.refusal:
            return ("revoked", self.authority.refusal)
        if self.breaker_pct and now - self.last_breaker_check >= self._breaker_check_s():
            self.last_breaker_check = now
            self.dead = self.store.dead_again(self.job.started_at)
        state = self.store.heartbeat(self._in_flight(), self.dead, self._broker_reason(now))
        if state is None:
            raise LeaseLost()
        if state == ReplayJob.State.CANCELLED:
            return ("cancelled", "")
        if state != ReplayJob.State.RUNNING:
            return ("left", state)
        if SHUTDOWN.is_set():
            return ("requeue", "the worker shut down; another worker continues the job")
        return self._breaker()

    def _in_flight(self):
        return sum(p.outstanding for p in self.publishers.values())

    def _broker_reason(self, now):
        down = [p for p in self.publishers.values() if not p.connected]
        if not down:
            self.disconnected_since = None
            return ""
        if self.disconnected_since is None:
            self.disconnected_since = now
        if now - self.disconnected_since < BROKER_QUIET_S:
            return ""
        return f"waiting for RabbitMQ ({down[0].last_error}); will resend what is unconfirmed"

    def _breaker_check_s(self):
        """How often to count what came back. While the sample is not full the breaker can trip
        only early (recovery.replay.safety.breaker_reason), on a fresh count: every control
        tick then, the few seconds it lasts at a slow rate (and the job page shows the count)."""
        if self.confirmed - self.job.breaker_base_confirmed < settings.REPLAY_BREAKER_MIN_SAMPLE:
            return CONTROL_S
        return BREAKER_CHECK_S

    def _breaker(self):
        job = self.job
        reason = breaker_reason(
            self.confirmed - job.breaker_base_confirmed,
            self.dead - job.breaker_base_dead,
            self.breaker_pct,
            settings.REPLAY_BREAKER_MIN_SAMPLE,
        )
        return ("pause", reason) if reason else None

    def _judge_canary(self):
        job = self.job
        counts = self.store.canary_counts()
        dead = self.store.dead_again(job.started_at, canary_only=True)
        reason = canary_reason(counts, dead, job.canary_max_failure_pct, job.canary_pause_seconds)
        if reason:
            return ("pause", reason)
        self.store.set_fields(canary_passed_at=timezone.now())
        Activity.record(
            None,
            "job_canary_passed",
            detail={"counts": counts, "dead_again": dead},
            via="system",
            job=self.job_id,
        )
        return None

    # ---- ends ---------------------------------------------------------------------------------

    def _stop(self, verdict):
        """Stop sending, settle what is in flight, then leave the job as the verdict says."""
        kind, reason = verdict
        release = self._running_claim_items()
        for publisher in self.publishers.values():
            publisher.withdraw()
        release += [entry.key for _vhost, entry, _claimed in self.buffer]
        for key in release:
            self.pending.pop(key, None)
        self.buffer.clear()
        unknown = self._drain_withdrawn(release)
        self._settle()
        self.store.release(release)
        unknown.extend(self.pending)
        self.store.release(
            unknown, "sent, but not confirmed before the job stopped: it may have been delivered"
        )
        self.store.reconcile()
        return self._leave(kind, reason)

    def _drain_withdrawn(self, release):
        """Wait (up to the confirm timeout) for the publishers' answers after a withdraw: what
        was never sent joins ``release``; what may have been sent is returned (unknown)."""
        unknown = []
        deadline = time.monotonic() + self.confirm_timeout + 2
        while self.pending and time.monotonic() < deadline:
            self.wakeup.clear()
            for publisher in self.publishers.values():
                for outcome in publisher.take_outcomes():
                    message_id, exchange, key = self.pending.pop(outcome.key)
                    if outcome.outcome == "withdrawn":
                        (unknown if outcome.maybe_sent else release).append(outcome.key)
                    else:
                        self.results.append(
                            (outcome.key, message_id, outcome.outcome, outcome.detail)
                            + (exchange, key)
                        )
            if self.pending:
                self.wakeup.wait(0.05)
        return unknown

    def _leave(self, kind, reason):
        """The job's state after a stop, and what run() returns."""
        if kind == "pause":
            self.store.end(ReplayJob.State.PAUSED, reason)
            Activity.record(
                None, "job_paused", detail={"reason": reason}, via="system", job=self.job_id
            )
            return "paused"
        if kind == "requeue":
            if self.store.end(ReplayJob.State.QUEUED, reason) == ReplayJob.State.QUEUED:
                ReplayJob.objects.get(pk=self.job_id).enqueue()
            return "requeued"
        if kind == "revoked":
            # For good: the right it was sent with is gone; someone who holds it may start a
            # new job for the rest (the job page offers it for a cancelled job).
            if self.store.end(ReplayJob.State.CANCELLED, reason) == ReplayJob.State.CANCELLED:
                Activity.record(
                    None, "job_stopped", detail={"reason": reason}, via="system", job=self.job_id
                )
            return "stopped"
        if kind == "sleep":
            wait = reason
            note = f"rate {self.job.rate:g}/s: the next message goes in {wait:.0f} s"
            if self.store.end(ReplayJob.State.QUEUED, note) == ReplayJob.State.QUEUED:
                ReplayJob.objects.get(pk=self.job_id).enqueue(countdown=wait, paced=True)
            return "sleeping"
        self.store.end(None, "")
        return "cancelled" if kind == "cancelled" else reason

    def _finish(self, counts):
        state = self.store.end(ReplayJob.State.DONE, "")
        if state == ReplayJob.State.DONE:
            Activity.record(
                None, "job_done", detail={"counts": counts}, via="system", job=self.job_id
            )
        return state or "lost"

    def _fail(self, exc):
        try:
            self.store.close()  # the failure may have broken the connection
            for publisher in self.publishers.values():
                publisher.withdraw()
            held = list(getattr(self, "pending", {}))
            try:
                held += self._running_claim_items()
            except Exception:
                log.warning("replay job %s: the last claim failed too", self.job_id)
            self.store.release(held, "the job failed before this message was confirmed")
            reason = f"failed: {type(exc).__name__}: {exc}"[:2000]
            if self.store.end(ReplayJob.State.FAILED, reason) == ReplayJob.State.FAILED:
                Activity.record(
                    None, "job_failed", detail={"reason": reason}, via="system", job=self.job_id
                )
        except Exception:
            log.exception("replay job %s: could not record the failure", self.job_id)
