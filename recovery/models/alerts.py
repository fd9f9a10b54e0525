"""Alerts: rules that watch Lazarus and the broker, their state and history, and the durable
outbox of notifications to webhooks, Slack and email (recovery/alerts/)."""

import datetime
import re
import secrets
from urllib.parse import urlsplit

from django.conf import settings
from django.db import models
from django.utils import timezone

from recovery.access.scope import Scope
from recovery.models.masking import MaskingRules


class AlertRule(models.Model):
    """One thing to watch (``kind`` + ``params``, optionally scoped) and its state.

    The state changes only through ``decide`` and ``apply_outcome``, which
    ``recovery.alerts.engine.evaluate`` calls once per cycle with the rule's check: ok -> firing
    notifies once, firing -> ok notifies once, a firing rule reminds every ``remind_every``
    (none: never); a muted rule keeps its state and history but notifies nobody until
    ``muted_until``. A check that raises makes the rule ``unknown`` (whatever it was: a check
    that cannot look cannot say it still fires, nor that it stopped), which notifies once when
    it has lasted ``unknown_after`` (docs/alerts.md "Unknown")."""

    class Kind(models.TextChoices):
        NEW_FAILURE_GROUP = "new_failure_group", "a new failure group appears"
        OPEN_MESSAGES = "open_messages", "open messages above a threshold"
        OPEN_GROWTH = "open_growth", "messages collected faster than a rate"
        COLLECTOR_DOWN = "collector_down", "no collector heartbeat"
        COLLECTOR_LAG = "collector_lag", "messages waiting in the recovery queues"
        REPLAY_JOB = "replay_job", "a replay job paused (canary, breaker) or failed"
        AUDIT = "audit", "an audit with loss, with warnings, or not run"
        BROKER_ALARM = "broker_alarm", "a broker memory or disk alarm, or blocked publishers"
        QUEUE_WITHOUT_CONSUMERS = "queue_without_consumers", "a recovery queue nobody consumes"
        UNCOVERED_QUEUES = "uncovered_queues", "queues whose dead letters Lazarus cannot see"
        BROKER_TALLY = "broker_tally", "the broker lost or dead-lettered what Lazarus lacks"
        RETENTION_ARCHIVE = "retention_archive", "retention could not archive what it deletes"

    class State(models.TextChoices):
        OK = "ok"
        FIRING = "firing"
        # The check raised (last_error): the condition is not known, never taken for ok.
        UNKNOWN = "unknown"

    name = models.CharField(max_length=200)
    kind = models.CharField(max_length=32, choices=Kind.choices)
    params = models.JSONField(default=dict, blank=True)
    # Scope (empty: everything). Which of them a kind reads: recovery.alerts.checks.
    vhost = models.CharField(max_length=255, blank=True, default="")
    queue = models.CharField(max_length=255, blank=True, default="")
    exchange = models.CharField(max_length=255, blank=True, default="")
    group_key = models.CharField(max_length=64, blank=True, default="")
    # The condition must hold this long before the rule fires (0: at once).
    for_seconds = models.IntegerField(default=0)
    remind_every = models.DurationField(null=True, blank=True)
    enabled = models.BooleanField(default=True)
    muted_until = models.DateTimeField(null=True, blank=True)
    channels = models.ManyToManyField("NotificationChannel", blank=True, related_name="rules")
    # A team's rule: its members see it, it watches only names in the team's scope and
    # notifies only the team's channels (``check_team``); null: a rule for global users.
    team = models.ForeignKey(
        "recovery.Team", null=True, blank=True, on_delete=models.SET_NULL, related_name="rules"
    )

    state = models.CharField(max_length=8, choices=State.choices, default=State.OK)
    # What the last check that could look decided (ok or firing): while unknown, what the rule
    # was before ("was firing"), and what deciding again after the error starts from.
    last_known_state = models.CharField(max_length=8, choices=State.choices[:2], default=State.OK)
    state_since = models.DateTimeField(default=timezone.now)
    condition_since = models.DateTimeField(null=True, blank=True)  # true, not yet long enough
    last_evaluated_at = models.DateTimeField(null=True, blank=True)
    last_notified_at = models.DateTimeField(null=True, blank=True)
    last_value = models.FloatField(null=True, blank=True)
    last_summary = models.TextField(blank=True, default="")
    last_items = models.JSONField(default=list, blank=True)
    # An evaluation that could not look (broker or database down): said, never taken as ok.
    last_error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name", "id"]

    def __str__(self):
        return f"{self.name} ({self.kind}, {self.state})"

    def activity_detail(self):
        """What an activity row keeps of a change to it (console and API alike)."""
        return {"id": self.pk, "name": self.name, "team": self.team.name if self.team else ""}

    # The kinds that watch messages (by vhost, queue, exchange): the only ones a team may own;
    # the others watch the broker, the collector or the audit, which are not a team's.
    TEAM_KINDS = (Kind.NEW_FAILURE_GROUP, Kind.OPEN_MESSAGES, Kind.OPEN_GROWTH)

    def team_problems(self, channels):
        """Why this rule cannot be saved so ({field: message}; empty when it can): a team's
        rule must watch a vhost and a queue or exchange the team's scope covers; every rule
        notifies only channels of its own team (a global rule only global channels: a team's
        Slack must not get what a global rule reports of every team)."""
        problems = {}
        if any(channel.team_id != self.team_id for channel in channels):
            problems["channels"] = (
                "a global rule notifies only global channels"
                if self.team_id is None
                else "a team's rule notifies only the team's channels"
            )
        if self.team_id is None:
            return problems
        return {**self.scope_problems(), **problems}

    def scope_problems(self):
        """Why a team's rule may not watch what it names (empty when it may, or for a global
        rule): asked when it is saved and again at each evaluation, since the team's scopes
        may have changed since (``recovery.alerts.checks.run_check``)."""
        if self.team_id is None:
            return {}
        problems = {}
        if self.kind not in self.TEAM_KINDS:
            problems["kind"] = "a team's rule watches messages: " + ", ".join(self.TEAM_KINDS)
        if not self.vhost or not (self.queue or self.exchange):
            problems["vhost"] = "a team's rule names its vhost and a queue or an exchange"
        elif not Scope.covers(self.team_id, self.vhost, self.queue, self.exchange):
            problems["queue"] = "outside the team's scopes"
        return problems

    @property
    def current_state(self) -> str:
        """The one state shown everywhere (list, page, API, /metrics): ``unknown`` when the
        check raised or the rule has not been evaluated lately, else ok or firing."""
        return self.State.UNKNOWN if self.unknown_reason else self.state

    @property
    def unknown_reason(self) -> str:
        """Why its state is unknown ("" when it is known): the check's error, or ``unchecked``."""
        if self.state == self.State.UNKNOWN:
            return f"cannot check: {self.last_error}"
        return self.unchecked

    @property
    def unchecked(self) -> str:
        """Why its state cannot be trusted now ("" when it can): never evaluated, or not for
        several evaluation periods (beat or its worker is not running)."""
        if self.last_evaluated_at is None:
            return "never evaluated"
        late = datetime.timedelta(seconds=4 * settings.ALERTS_EVALUATE_SECONDS)
        if timezone.now() - self.last_evaluated_at > late:
            return f"not evaluated since {self.last_evaluated_at:%Y-%m-%d %H:%M} UTC"
        return ""

    def muted(self, now=None) -> bool:
        return bool(self.muted_until and self.muted_until > (now or timezone.now()))

    @property
    def scope(self) -> dict:
        return {
            k: v
            for k, v in (
                ("vhost", self.vhost),
                ("queue", self.queue),
                ("exchange", self.exchange),
                ("group_key", self.group_key),
            )
            if v
        }

    # What an evaluation may change on a rule besides last_evaluated_at (which the engine sets
    # for the whole cycle in one statement): a rule none of these changed for is not saved.
    EVALUATED_FIELDS = (
        "state",
        "state_since",
        "last_known_state",
        "condition_since",
        "last_value",
        "last_summary",
        "last_items",
        "last_error",
        "last_notified_at",
    )

    # Set by ``decide`` for ``apply_outcome``: the state entered (or "error": still unknown,
    # for another reason), None when the history has nothing to add.
    transition: str | None = None

    def evaluated_state(self) -> tuple:
        """The values of EVALUATED_FIELDS: compared before and after ``decide``."""
        return tuple(getattr(self, name) for name in self.EVALUATED_FIELDS)

    @property
    def unknown_after(self) -> datetime.timedelta:
        """How long a check must keep failing before ``unknown`` is notified: ``for_seconds``,
        and at least one evaluation period, so one blip of the management API pages nobody."""
        return datetime.timedelta(seconds=max(self.for_seconds, settings.ALERTS_EVALUATE_SECONDS))

    def decide(self, now, check) -> str | None:
        """Apply one check (a ``recovery.alerts.checks.Check``, or the exception the check
        raised) to the rule in memory; returns the event to notify (firing, resolved, reminder,
        updated, unknown) or None. Saves nothing: ``apply_outcome`` does (``transition`` says
        which state it entered, if any).

        A check that could not look makes the rule unknown; the first check that looks again
        decides from the state before (``last_known_state``)."""
        self.transition = None
        if isinstance(check, Exception):
            event = self._decide_unknown(now, check)
        else:
            event = self._decide_known(now, check)
        if self.muted(now) and event not in ("firing", "resolved"):
            # Muted: the state still changes (and is returned), but nothing is said, so there
            # is nothing to remind of or update.
            event = None
        return event

    def _told_since(self, since) -> bool:
        return self.last_notified_at is not None and self.last_notified_at >= since

    def _decide_unknown(self, now, exc) -> str | None:
        error = f"{type(exc).__name__}: {exc}"[:1000]
        if self.state == self.State.UNKNOWN and error != self.last_error:
            self.transition = "error"  # still unknown, for another reason: kept once
        self.last_error = error
        # condition_since stays: the condition is not known to have stopped (or started).
        if self.state != self.State.UNKNOWN:
            self.last_known_state = self.state
            self.state, self.state_since = self.State.UNKNOWN, now
            self.transition = self.State.UNKNOWN
        if now - self.state_since >= self.unknown_after and not self._told_since(self.state_since):
            return "unknown"
        return None

    def _decide_known(self, now, check) -> str | None:
        event = None
        held = datetime.timedelta(seconds=self.for_seconds)
        if check.firing:
            self.condition_since = self.condition_since or now
        else:
            self.condition_since = None
        should_fire = check.firing and now - self.condition_since >= held
        if self.state == self.State.UNKNOWN:
            # Back from unknown: a state of its own again. Said when it differs from what was
            # last said: the state before, unless "unknown" was said meanwhile.
            told_unknown = self._told_since(self.state_since)
            new = self.State.FIRING if should_fire else self.State.OK
            self.state, self.state_since, self.transition = new, now, new
            if new != self.last_known_state or told_unknown:
                event = "firing" if new == self.State.FIRING else "resolved"
        elif should_fire and self.state == self.State.OK:
            self.state, self.state_since, event = self.State.FIRING, now, "firing"
            self.transition = self.state
        elif not check.firing and self.state == self.State.FIRING:
            self.state, self.state_since, event = self.State.OK, now, "resolved"
            self.transition = self.state
        elif self.state == self.State.FIRING:
            if self.kind == self.Kind.NEW_FAILURE_GROUP and set(check.items) - set(self.last_items):
                event = "updated"
            elif self.remind_every and now - (self.last_notified_at or self.state_since) >= (
                self.remind_every
            ):
                event = "reminder"
        self.last_known_state = self.state
        self.last_value = check.value
        self.last_summary = check.summary
        self.last_items = check.items
        self.last_error = ""
        return event

    def apply_outcome(self, now, check, event) -> None:
        """Write what ``decide`` changed: the transition, the notifications, the rule. The
        caller holds the rule's row lock (``select_for_update``) and a transaction."""
        self.last_evaluated_at = now
        failed = isinstance(check, Exception)
        if self.transition:
            AlertTransition.objects.create(
                rule=self,
                at=now,
                state=self.transition,
                value=None if failed else check.value,
                summary=self.last_error if failed else check.summary,
            )
        if event and not self.muted(now):
            self.queue_notifications(event, now, None if failed else check)
        self.save()

    def notification_payload(self, event, now, check=None) -> dict:
        """The documented notification body (docs/alerts.md); without a check, the last one
        the rule saw."""
        body = {
            "event": event,
            "at": now.isoformat(),
            "rule": {
                "id": self.pk,
                "name": self.name,
                "kind": self.kind,
                "scope": self.scope,
                "state": self.state,
                "since": self.state_since.isoformat(),
                "url": console_url(f"/alerts/{self.pk}/"),
            },
            "value": check.value if check else self.last_value,
            "summary": check.summary if check else self.last_summary,
            "items": check.items if check else self.last_items,
            # Why the state is unknown ("" when it is known): the check's error.
            "error": self.last_error,
            "last_known_state": self.last_known_state,
        }
        if event == "unknown":
            body.update(value=None, summary=f"cannot check: {self.last_error}", items=[])
        return MaskingRules.load().notification_payload(body, self.team_id)

    def queue_notifications(self, event, now, check=None) -> int:
        """One outbox row per enabled channel (delivered later, outside any transaction, by
        ``recovery.alerts.deliver``); returns how many."""
        # Only channels of the rule's own team, whatever the rule and channel rows say now: a
        # channel moved to another team since, or linked before that was refused, is skipped.
        channels = [c for c in self.channels.all() if c.enabled and c.team_id == self.team_id]
        body = self.notification_payload(event, now, check)
        Notification.objects.bulk_create(
            Notification(rule=self, channel=c, event=event, payload=body, next_attempt_at=now)
            for c in channels
        )
        self.last_notified_at = now
        return len(channels)


def console_url(path=""):
    return settings.CONSOLE_BASE_URL.rstrip("/") + path


class AlertTransition(models.Model):
    """A rule's history: every change of state (and every other error while it is unknown)."""

    rule = models.ForeignKey(AlertRule, on_delete=models.CASCADE, related_name="transitions")
    at = models.DateTimeField(default=timezone.now)
    # firing | ok | unknown (entered), error (still unknown, another error)
    state = models.CharField(max_length=16)
    value = models.FloatField(null=True, blank=True)
    summary = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [models.Index(fields=["rule", "-at"], name="alert_transition_rule")]


def new_secret():
    return secrets.token_hex(32)


# A URL (any scheme) or an email address inside an error text.
_URL_OR_ADDRESS = re.compile(
    r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?P<rest>[^\s'\"<>]*)"
    r"|[A-Za-z0-9.!#$%&*+/=?^_`{|}~-]+@(?P<domain>[A-Za-z0-9.-]+\.[A-Za-z]{2,})"
)


def _host_only(match):
    if match.group("scheme") is None:
        return f"…@{match.group('domain')}"
    # The host is what follows the last "@" of the authority (credentials come before it).
    authority = re.split(r"[/?#]", match.group("rest"), maxsplit=1)[0].rpartition("@")[2]
    return f"{match.group('scheme')}://{authority}"


def redact_target(text: str, target: str = "") -> str:
    """``text`` (an error) as a non-admin may read it: every URL cut to its scheme and host (no
    credentials, path or query), email addresses to their domain, and whatever else of the
    channel's ``target`` appears bare (http.client quotes just the path of a bad URL)."""
    if not text:
        return text
    target = target.strip()
    parts = urlsplit(target) if "://" in target else None
    if parts:
        # The target itself first (a space in it would end the URL pattern's match early).
        text = text.replace(target, f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}")
        secret_bits = [parts.path + (f"?{parts.query}" if parts.query else ""), parts.path]
        secret_bits += [parts.query, parts.netloc.rpartition("@")[0]]
        for bit in sorted(secret_bits, key=len, reverse=True):
            if len(bit) > 1:
                text = text.replace(bit, "…")
    else:
        for address in target.split(","):
            if address.strip():
                text = text.replace(address.strip(), "…@" + address.strip().rpartition("@")[2])
    return _URL_OR_ADDRESS.sub(_host_only, text)


class NotificationChannel(models.Model):
    """Where notifications go. ``target``: the URL (webhook, slack) or comma-separated email
    addresses. A webhook body is signed with ``secret`` (recovery/alerts/deliver.py)."""

    class Kind(models.TextChoices):
        WEBHOOK = "webhook"
        SLACK = "slack"
        EMAIL = "email"

    name = models.CharField(max_length=200)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    target = models.TextField()
    # A team's channel: its members see it (never its target); null: for global users.
    team = models.ForeignKey(
        "recovery.Team", null=True, blank=True, on_delete=models.SET_NULL, related_name="channels"
    )
    secret = models.CharField(max_length=128, default=new_secret, blank=True)
    enabled = models.BooleanField(default=True)
    consecutive_failures = models.IntegerField(default=0)
    last_error = models.TextField(blank=True, default="")
    last_success_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    # This many failed attempts in a row and the channel is shown as failing.
    FAILING_AFTER = 3

    class Meta:
        ordering = ["name", "id"]

    def __str__(self):
        return f"{self.name} ({self.kind})"

    def activity_detail(self):
        """What an activity row keeps of a change to it (console and API alike)."""
        return {"id": self.pk, "name": self.name, "team": self.team.name if self.team else ""}

    @property
    def failing(self) -> bool:
        return self.consecutive_failures >= self.FAILING_AFTER

    @property
    def public_error(self) -> str:
        """``last_error`` as a non-admin may see it (``redact_target``)."""
        return redact_target(self.last_error, self.target)

    def rotate_secret(self) -> str:
        """A new signing secret, saved; returned so the admin who asked can see it once."""
        self.secret = new_secret()
        self.save(update_fields=["secret"])
        return self.secret

    # Both are UPDATEs of the row, not saves of this copy: the copy a delivery pass holds may
    # be stale (another pass, the console), and a channel deleted meanwhile is simply skipped.
    def record_success(self, now) -> None:
        NotificationChannel.objects.filter(pk=self.pk).update(
            consecutive_failures=0, last_success_at=now
        )
        self.consecutive_failures, self.last_success_at = 0, now

    def record_failure(self, error: str) -> None:
        counted = NotificationChannel.objects.filter(pk=self.pk).update(
            consecutive_failures=models.F("consecutive_failures") + 1, last_error=error
        )
        self.last_error = error
        if counted:
            self.refresh_from_db(fields=["consecutive_failures"])


class Notification(models.Model):
    """The outbox: one notification to one channel, delivered with retries and backoff by
    ``recovery.alerts.deliver``; evaluation only inserts rows, so a slow or dead receiver never
    holds it up."""

    class Status(models.TextChoices):
        PENDING = "pending"
        DELIVERED = "delivered"
        FAILED = "failed"  # gave up after ALERTS_MAX_ATTEMPTS

    rule = models.ForeignKey(
        AlertRule, null=True, blank=True, on_delete=models.CASCADE, related_name="notifications"
    )
    channel = models.ForeignKey(
        NotificationChannel, on_delete=models.CASCADE, related_name="notifications"
    )
    # firing | resolved | reminder | updated | unknown | test
    event = models.CharField(max_length=16)
    payload = models.JSONField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    attempts = models.IntegerField(default=0)
    next_attempt_at = models.DateTimeField(default=timezone.now)
    last_error = models.TextField(blank=True, default="")
    # Every attempt: [{at, ok, result, error}], newest last (capped: ATTEMPTS_KEPT).
    attempt_log = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(
                fields=["next_attempt_at"],
                name="notification_due",
                condition=models.Q(status="pending"),
            )
        ]

    # Entries of attempt_log kept: a notification retried for days stays a small row.
    ATTEMPTS_KEPT = 20

    @property
    def public_error(self) -> str:
        """``last_error`` as a non-admin may see it (``redact_target``)."""
        return redact_target(self.last_error, self.channel.target)

    @property
    def public_attempt_log(self) -> list:
        """``attempt_log`` with each error as a non-admin may see it."""
        target = self.channel.target
        return [{**a, "error": redact_target(a.get("error", ""), target)} for a in self.attempt_log]

    @staticmethod
    def backoff(attempts: int) -> datetime.timedelta:
        """The wait after ``attempts`` failed attempts: 30 s, 1 min, 2 min, ... capped at an
        hour."""
        return datetime.timedelta(seconds=min(30 * 2 ** max(attempts - 1, 0), 3600))

    def claim(self, until) -> bool:
        """Take this notification for one attempt: a conditional UPDATE only one delivery pass
        wins (as healthchecks' sendalerts claims a flip). Its ``next_attempt_at`` moves to
        ``until``, so no pass picks it up meanwhile; the outcome (``record_delivered`` /
        ``record_failed``) sets it again, and a send that never records (its worker killed)
        is due again at ``until``."""
        won = Notification.objects.filter(
            pk=self.pk,
            status=self.Status.PENDING,
            attempts=self.attempts,
            next_attempt_at=self.next_attempt_at,
        ).update(next_attempt_at=until)
        if won:
            self.next_attempt_at = until
        return bool(won)

    def record_delivered(self, now, result: str) -> bool:
        """One attempt that reached the receiver (``result``: what it answered): delivered,
        and the channel's run of failures ends. False (nothing recorded) when this copy no
        longer holds the notification (``_record``)."""
        if not self._record(
            now,
            ok=True,
            result=result,
            error="",
            status=self.Status.DELIVERED,
            delivered_at=now,
            last_error="",
        ):
            return False
        self.channel.record_success(now)
        return True

    def record_failed(self, now, error: str) -> bool:
        """One attempt that failed: retried after ``backoff``, or given up (``failed``) at
        ALERTS_MAX_ATTEMPTS; the channel counts one more failure in a row. False (nothing
        recorded) when this copy no longer holds the notification (``_record``)."""
        error = error[:1000]
        attempts = self.attempts + 1
        if attempts >= settings.ALERTS_MAX_ATTEMPTS:
            outcome = {"status": self.Status.FAILED}
        else:
            outcome = {"next_attempt_at": now + self.backoff(attempts)}
        if not self._record(now, ok=False, result="", error=error, last_error=error, **outcome):
            return False
        self.channel.record_failure(error)
        return True

    def _record(self, now, ok, result, error, **fields) -> bool:
        """Write one attempt's outcome with an UPDATE conditional on the claim this copy holds
        (pending, ``next_attempt_at`` its lease), never a save: a row deleted meanwhile (its
        rule or channel deleted while the send ran) would be inserted again by a save, and a
        claim another pass took over is that pass's to record. Either way nothing is written."""
        fields["attempts"] = self.attempts + 1
        fields["attempt_log"] = [
            *self.attempt_log[-(self.ATTEMPTS_KEPT - 1) :],
            {"at": now.isoformat(), "ok": ok, "result": result, "error": error},
        ]
        held = Notification.objects.filter(
            pk=self.pk, status=self.Status.PENDING, next_attempt_at=self.next_attempt_at
        ).update(**fields)
        if held:
            for name, value in fields.items():
                setattr(self, name, value)
        return bool(held)
