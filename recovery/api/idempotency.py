"""``Idempotency-Key`` for POSTs that send messages: a client's retry never publishes twice.

The first request with a key claims a row (committed before the view runs, so a concurrent twin
sees it and gets 409); its response is stored and every retry with the same key, user and request
(method, path, JSON body) gets it back with ``Idempotent-Replayed: true``. The same key on a
different request is a 422.

What is stored follows what happened: a response means the view ran to the end, so it is kept
(success, a ``returned`` outcome, a validation error). Answers that sent nothing and may well
succeed later (409 not replayable now, 429, 503 broker unavailable) release the key so the retry
really runs. An unexpected exception may have struck after the publish, so its outcome is
unknown: that is stored as a 500 and the client must look before it retries with a new key.
"""

import datetime
import hashlib
import json
from functools import wraps

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.serializers.json import DjangoJSONEncoder
from django.db import IntegrityError, transaction
from django.http import Http404
from django.utils import timezone
from rest_framework.exceptions import APIException
from rest_framework.response import Response

from recovery.api.errors import PROBLEM_CONTENT_TYPE, problem, problem_response
from recovery.models import IdempotencyKey

HEADER = "Idempotency-Key"
KEPT_HEADERS = ("Location",)
MAX_KEY_LENGTH = 255
# Answers after which nothing was sent and a retry may succeed: the key is released.
RELEASED_STATUSES = {409, 429, 503}
# Exceptions raised before anything is sent (lookups, validation, permissions).
NOTHING_SENT = (APIException, Http404, PermissionDenied, DjangoValidationError)


def request_fingerprint(request):
    fields = {"method": request.method, "path": request.path, "body": request.data}
    # A token acting as a team never gets back what its user did as another scope: the same
    # key from the other is "another request" (the key stays the user's, as before teams).
    token = getattr(request, "auth", None)
    if getattr(token, "team_id", None) is not None:
        fields["team"] = token.team_id
    payload = json.dumps(fields, sort_keys=True, cls=DjangoJSONEncoder)
    return hashlib.sha256(payload.encode()).hexdigest()


def key_error(key):
    if not key or len(key) > MAX_KEY_LENGTH:
        return f"Must be 1 to {MAX_KEY_LENGTH} characters."
    if not key.isascii() or not key.isprintable():
        return "Must be printable ASCII (a UUID is a good key)."
    return None


def claim(user, key, fingerprint, request):
    """(row, True) when this request owns the key; (existing row, False) otherwise."""
    now = timezone.now()
    ttl = datetime.timedelta(hours=settings.IDEMPOTENCY_TTL_HOURS)
    IdempotencyKey.objects.filter(user=user, key=key, expires_at__lt=now).delete()
    try:
        with transaction.atomic():
            row = IdempotencyKey.objects.create(
                user=user,
                key=key,
                request_hash=fingerprint,
                method=request.method,
                path=request.path[:500],
                expires_at=now + ttl,
            )
    except IntegrityError:
        return IdempotencyKey.objects.get(user=user, key=key), False
    # Opportunistic clean-up; the index on expires_at keeps it cheap.
    IdempotencyKey.objects.filter(expires_at__lt=now).delete()
    return row, True


def stored_response(row):
    content_type = PROBLEM_CONTENT_TYPE if row.status_code >= 400 else None
    return Response(
        row.response,
        status=row.status_code,
        headers={**row.response_headers, "Idempotent-Replayed": "true"},
        content_type=content_type,
    )


def store(row, status_code, data, headers=None):
    row.status_code = status_code
    row.response = json.loads(json.dumps(data, cls=DjangoJSONEncoder))
    row.response_headers = {
        name: headers[name] for name in KEPT_HEADERS if headers is not None and name in headers
    }
    row.save(update_fields=["status_code", "response", "response_headers"])


def idempotent(view):
    """Decorate a DRF function view (below ``@api_view``, so auth and roles come first)."""

    @wraps(view)
    def wrapper(request, *args, **kwargs):
        key = request.headers.get(HEADER)
        if key is None:
            return view(request, *args, **kwargs)
        error = key_error(key)
        if error:
            return problem_response(
                400, f"{HEADER}: {error}", "invalid", request, errors={HEADER: [error]}
            )
        row, owner = claim(request.user, key, request_fingerprint(request), request)
        if not owner:
            return answer_for_existing(request, row)
        try:
            response = view(request, *args, **kwargs)
        except NOTHING_SENT:
            row.delete()
            raise
        except Exception:
            store(
                row,
                500,
                problem(
                    500,
                    "The request failed unexpectedly; whether it sent anything is unknown. Check "
                    "the message or job before retrying with a new Idempotency-Key.",
                    "server_error",
                    request.path,
                ),
            )
            raise
        if response.status_code in RELEASED_STATUSES:
            row.delete()
        else:
            store(row, response.status_code, response.data, response)
        return response

    return wrapper


def answer_for_existing(request, row):
    if row.request_hash != request_fingerprint(request):
        return problem_response(
            422,
            f"This {HEADER} was already used for a different request "
            f"({row.method} {row.path}); use a new key for a new request.",
            "idempotency_key_reused",
            request,
        )
    if row.status_code is None:
        return problem_response(
            409,
            f"A request with this {HEADER} is still in progress (since "
            f"{row.created_at.isoformat()}). Retry shortly; if it never finished, its outcome is "
            "unknown: check the message or job before retrying with a new key.",
            "idempotency_key_in_progress",
            request,
        )
    return stored_response(row)
