"""``POST /v1/traces``: the OTLP/HTTP trace intake (#47). Any OpenTelemetry SDK's OTLP exporter,
or the Collector's ``otlphttp`` exporter, pointed at Lazarus (``OTEL_EXPORTER_OTLP_ENDPOINT`` =
the console's URL) sends here; the messaging spans are kept as Parquet under ``AUDIT_SPANS``
(recovery.telemetry.store), never in PostgreSQL.

A plain Django view, not DRF: the body and the answer are protobuf or OTLP/JSON, in the
encoding the request used, and the failure bodies are ``google.rpc.Status`` (the OTLP/HTTP
spec), not problem+json.

Token: ``Authorization: Token <key>`` or ``Bearer <key>`` (exporters are configured with
``OTEL_EXPORTER_OTLP_HEADERS=Authorization=Bearer%20<key>``), an API token whose role, in its
scope, is operator or above: spans decide what the audit calls lost, so a viewer's token may
not write them. A team token may (the spans are not team data; its team is not recorded).

Answers, as the spec has exporters read them:
- 200 with an ``ExportTraceServiceResponse`` once every kept span is durable (fsynced and
  renamed: recovery.telemetry.store); ``partial_success`` counts the messaging spans that could
  not be rows (bad ids, no start time). Spans that are not messaging spans are dropped, not
  rejected: they are valid, the audit does not need them.
- 400 malformed, 401 no or bad token, 403 a viewer's token, 405 not POST, 413 too large, 415 not
  protobuf/JSON or not gzip: not retryable, the exporter drops the batch and logs it.
- 503 with ``Retry-After`` when the intake cannot take the batch now: more than
  ``OTLP_MAX_IN_FLIGHT`` batches being written in this process, less than ``OTLP_MIN_FREE_BYTES``
  free where the spans go, or the write failed. Exporters retry 503 (and 429) with back-off: no
  batch is dropped silently and none is acknowledged before it is durable.
"""

import logging

from django.conf import settings
from django.core.handlers.wsgi import LimitedStream
from django.http import HttpResponse
from django.views.decorators.csrf import csrf_exempt

from recovery.access.models import ApiToken
from recovery.access.scope import Scope
from recovery.models import Role
from recovery.telemetry import otlp

log = logging.getLogger(__name__)

SCHEMES = ("token", "bearer")


class Refused(Exception):
    def __init__(self, status, code, message, retry_after=None):
        super().__init__(message)
        self.status, self.code, self.message, self.retry_after = status, code, message, retry_after


# google.rpc.Code numbers for the Status body.
INVALID_ARGUMENT, UNAUTHENTICATED, PERMISSION_DENIED, UNAVAILABLE = 3, 16, 7, 14
RESOURCE_EXHAUSTED, UNIMPLEMENTED = 8, 12


@csrf_exempt
def export_traces(request):
    media = otlp.JSON
    try:
        if request.method != "POST":
            raise Refused(405, UNIMPLEMENTED, "POST an ExportTraceServiceRequest")
        media = otlp.media_of(request.content_type)
        _authorize(request)
        body = _read_body(request)
        inflated = otlp.inflate(
            body, request.headers.get("Content-Encoding"), settings.OTLP_MAX_INFLATED_BYTES
        )
        decoded = otlp.decode(inflated, media)
        # Here, not at the top: the URL conf imports this module everywhere Django starts
        # (every Celery worker), and the rows and their store need pyarrow (~80 MB).
        from recovery.telemetry import spans

        flattened = spans.flatten(decoded)
        _write(flattened)
    except Refused as refused:
        return _failure(media, refused)
    except otlp.UnsupportedMedia as error:
        return _failure(media, Refused(415, INVALID_ARGUMENT, str(error)))
    except otlp.TooLarge as error:
        return _failure(media, Refused(413, RESOURCE_EXHAUSTED, str(error)))
    except otlp.Malformed as error:
        return _failure(media, Refused(400, INVALID_ARGUMENT, str(error)))
    return HttpResponse(
        otlp.response(media, flattened.rejected, flattened.error_message), content_type=media
    )


def _authorize(request):
    scheme, _, key = request.headers.get("Authorization", "").strip().partition(" ")
    if scheme.lower() not in SCHEMES or not key.strip():
        raise Refused(401, UNAUTHENTICATED, "send Authorization: Bearer <API token>")
    token = ApiToken.authenticate(key.strip())
    if token is None:
        raise Refused(401, UNAUTHENTICATED, "invalid or revoked token")
    if not Scope.of(token.user, token.team_id).has_role(Role.OPERATOR):
        raise Refused(403, PERMISSION_DENIED, "the token's role may not write spans (operator+)")


def _read_body(request):
    """The raw body, at most OTLP_MAX_BODY_BYTES. A body with no Content-Length (chunked: Node's
    exporter pipes a stream into the request) would be read by Django as empty: it is read off
    the stream, already decoded where the server says so (``wsgi.input_terminated``: gunicorn),
    else decoded here."""
    limit = settings.OTLP_MAX_BODY_BYTES
    length = request.META.get("CONTENT_LENGTH") or ""
    if length.strip():
        try:
            size = int(length)
        except ValueError:
            raise Refused(400, INVALID_ARGUMENT, "Content-Length is not a number") from None
        if size > limit:
            raise otlp.TooLarge(f"a body of {size} bytes, past OTLP_MAX_BODY_BYTES ({limit})")
        return request.read(size)  # not request.body: DATA_UPLOAD_MAX_MEMORY_SIZE is for forms
    stream = request.META["wsgi.input"]
    if request.META.get("wsgi.input_terminated"):
        body = stream.read(limit + 1)
        if len(body) > limit:
            raise otlp.TooLarge(f"the body is past OTLP_MAX_BODY_BYTES ({limit})")
        return body
    if "chunked" in request.headers.get("Transfer-Encoding", "").lower():
        return _dechunk(_undecoded(stream), limit)
    return b""


def _undecoded(stream):
    """Django's development server (``runserver``, the tests' live server) hands the app the
    socket behind a LimitedStream of the Content-Length, 0 for a chunked body: read past it, to
    the socket, which holds the chunked body undecoded. Any other server's stream as it is."""
    if isinstance(stream, LimitedStream) and stream.limit == 0:
        return _Raw(stream._read, stream._readline)  # noqa: SLF001 - no public way to it
    return stream


class _Raw:
    def __init__(self, read, readline):
        self.read, self.readline = read, readline


def _dechunk(stream, limit):
    """A chunked body read off a server that passes the socket through undecoded (wsgiref,
    ``runserver``): chunk by chunk to the last (size 0) and its trailers, never past ``limit``."""
    chunks, size = [], 0
    while True:
        line = stream.readline(1024)
        try:
            length = int(line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise otlp.Malformed("a chunked body with a bad chunk size") from None
        if length == 0:
            while stream.readline(8192) not in (b"\r\n", b"\n", b""):
                pass
            return b"".join(chunks)
        size += length
        if size > limit:
            raise otlp.TooLarge(f"the body is past OTLP_MAX_BODY_BYTES ({limit})")
        chunk = stream.read(length)
        if len(chunk) < length:
            raise otlp.Malformed("a chunked body that ends inside a chunk")
        chunks.append(chunk)
        stream.readline(8)  # the chunk's CRLF


def _write(flattened):
    from recovery.telemetry import store

    if not flattened.kept:
        return
    base = settings.AUDIT_SPANS
    retry = settings.OTLP_RETRY_AFTER_SECONDS
    free = store.free_bytes(base)
    if free is not None and free < settings.OTLP_MIN_FREE_BYTES:
        log.warning("span intake: %s bytes free under %s, refusing batches", free, base)
        raise Refused(
            503, UNAVAILABLE, f"short of disk under AUDIT_SPANS ({free} bytes free)", retry
        )
    try:
        with store.IN_FLIGHT.slot(settings.OTLP_MAX_IN_FLIGHT):
            store.write(base, flattened)
    except store.Unavailable as error:
        raise Refused(503, UNAVAILABLE, str(error), retry) from None
    except OSError as error:
        log.exception("span intake: writing under %s failed", base)
        raise Refused(503, UNAVAILABLE, f"the spans could not be written: {error}", retry) from None


def _failure(media, refused):
    response = HttpResponse(
        otlp.status(media, refused.code, refused.message),
        status=refused.status,
        content_type=media,
    )
    if refused.retry_after is not None:
        response["Retry-After"] = str(int(refused.retry_after))
    return response
