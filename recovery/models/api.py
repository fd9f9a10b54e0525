"""The API's own bookkeeping: idempotency keys of POSTs that send messages, and the per-token
rate windows (recovery.api.idempotency, recovery.api.throttling)."""

from django.conf import settings
from django.db import models
from django.utils import timezone


class IdempotencyKey(models.Model):
    """An API client's ``Idempotency-Key`` on a POST that sends messages (recovery.api).

    The first request with a key claims the row (``status_code`` null while it runs); its response
    is stored, and a retry with the same key, user and request gets that response back instead of
    publishing again. Rows expire after ``IDEMPOTENCY_TTL_HOURS``.
    """

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    key = models.CharField(max_length=255)
    # SHA-256 of method, path and canonical JSON body: the same key on another request is an error.
    request_hash = models.CharField(max_length=64)
    method = models.CharField(max_length=8)
    path = models.CharField(max_length=500)
    status_code = models.IntegerField(null=True, blank=True)
    response = models.JSONField(null=True, blank=True)
    # Headers the retry must get back too (Location of a created job).
    response_headers = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField(db_index=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "key"], name="idempotency_user_key")]


class ApiRateWindow(models.Model):
    """Requests one API token made in one fixed window: the per-token rate limit's counter.

    A row in PostgreSQL (atomic upsert) rather than a per-process cache, so the limit holds
    across every web process and machine.
    """

    scope = models.CharField(max_length=64)  # "token:<id>" or "user:<id>" (session clients)
    window_start = models.DateTimeField()
    count = models.IntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["scope", "window_start"], name="rate_window_unique")
        ]
