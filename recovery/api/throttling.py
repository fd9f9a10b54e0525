"""Per-token rate limit (setting ``API_RATE_LIMIT``, e.g. ``600/min``), counted in PostgreSQL.

A fixed window per token: one atomic ``INSERT … ON CONFLICT DO UPDATE … RETURNING count`` per
request, so every web process and machine shares one counter without a cache server. A fixed
window lets a client burst up to twice the rate across a window boundary; that is the price of a
single-row counter, and well inside what a 429 is for (protecting the store from runaway scripts).
"""

import datetime
import math
import time

from django.conf import settings
from django.db import connection
from rest_framework.throttling import BaseThrottle

from recovery.api.auth import HashedTokenAuthentication
from recovery.models import ApiRateWindow, ApiToken
from recovery.rates import parse_rate

UPSERT = f"""
    INSERT INTO {ApiRateWindow._meta.db_table} (scope, window_start, count)
    VALUES (%s, %s, 1)
    ON CONFLICT (scope, window_start) DO UPDATE SET count = {ApiRateWindow._meta.db_table}.count + 1
    RETURNING count
"""


class TokenRateThrottle(BaseThrottle):
    """Scoped per API token (per user for browser sessions using /api/docs)."""

    def __init__(self):
        self.limit, self.period = parse_rate(settings.API_RATE_LIMIT)
        self.retry_after = None

    def scope_of(self, request):
        if isinstance(request.successful_authenticator, HashedTokenAuthentication) and isinstance(
            request.auth, ApiToken
        ):
            return f"token:{request.auth.pk}"
        if request.user and request.user.is_authenticated:
            return f"user:{request.user.pk}"
        return None  # anonymous requests are refused with 401 before throttling

    def allow_request(self, request, view):
        scope = self.scope_of(request)
        if scope is None:
            return True
        now = time.time()
        window_start = math.floor(now / self.period) * self.period
        window = datetime.datetime.fromtimestamp(window_start, tz=datetime.UTC)
        with connection.cursor() as cursor:
            cursor.execute(UPSERT, [scope, window])
            count = cursor.fetchone()[0]
        if count == 1:
            # First request of a new window: the token's older windows are dead weight.
            ApiRateWindow.objects.filter(scope=scope, window_start__lt=window).delete()
        if count <= self.limit:
            return True
        self.retry_after = max(1, math.ceil(window_start + self.period - now))
        return False

    def wait(self):
        return self.retry_after
