"""One error format for the whole API: RFC 9457 (ex-7807) ``application/problem+json``.

Every error — validation, 401, 403, 404, 405, 409, 415, 422, 429, 500, 503, and a URL under
``/api/`` that matches nothing — is an object with ``type``, ``title``, ``status``, ``detail``,
``code`` and ``instance``; validation errors add ``errors``: ``{"field": ["message", ...]}`` where
nested fields are dotted (``target.exchange``) and errors not tied to a field are under
``non_field_errors``. Clients can branch on ``status`` and ``code`` and show ``detail``.
"""

import logging
from http import HTTPStatus

from django.conf import settings
from django.core.exceptions import NON_FIELD_ERRORS, RequestDataTooBig
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import JsonResponse
from django.views import defaults
from django.views.decorators.csrf import csrf_exempt
from rest_framework import exceptions, serializers, status
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.views import exception_handler as drf_exception_handler
from rest_framework.views import set_rollback

log = logging.getLogger(__name__)

PROBLEM_CONTENT_TYPE = "application/problem+json"
NON_FIELD = api_settings.NON_FIELD_ERRORS_KEY


class ProblemSerializer(serializers.Serializer):
    """The error body (schema only; errors are built by ``problem``)."""

    type = serializers.CharField(help_text="`about:blank`: the status and code say it all.")
    title = serializers.CharField(help_text="The HTTP status phrase, e.g. `Not Found`.")
    status = serializers.IntegerField()
    detail = serializers.CharField(help_text="What went wrong, for a human.")
    code = serializers.CharField(
        help_text="Stable machine code: `invalid`, `not_authenticated`, `authentication_failed`, "
        "`permission_denied`, `not_found`, `method_not_allowed`, `unsupported_media_type`, "
        "`throttled`, `conflict`, `idempotency_key_reused`, `idempotency_key_in_progress`, "
        "`broker_unavailable`, `server_error`, …"
    )
    instance = serializers.CharField(help_text="The request path.")
    errors = serializers.DictField(
        child=serializers.ListField(child=serializers.CharField()),
        required=False,
        help_text="Validation errors by field (dotted for nested fields).",
    )


def problem(status_code, detail, code, instance="", errors=None):
    body = {
        "type": "about:blank",
        "title": HTTPStatus(status_code).phrase,
        "status": status_code,
        "detail": str(detail),
        "code": str(code),
        "instance": instance,
    }
    if errors is not None:
        body["errors"] = errors
    return body


def problem_response(status_code, detail, code, request=None, errors=None, headers=None):
    """A DRF Response carrying a problem (for views that answer an error themselves)."""
    instance = request.path if request is not None else ""
    return Response(
        problem(status_code, detail, code, instance, errors),
        status=status_code,
        headers=headers,
        content_type=PROBLEM_CONTENT_TYPE,
    )


def flatten_errors(detail, prefix=""):
    """DRF's nested error detail -> {"dotted.field": ["message", ...]}."""
    flat = {}
    if isinstance(detail, dict):
        for field, value in detail.items():
            key = f"{prefix}.{field}" if prefix else str(field)
            flat.update(flatten_errors(value, key))
    elif isinstance(detail, list) and any(isinstance(item, dict | list) for item in detail):
        for index, value in enumerate(detail):
            if value:  # ListField errors put {} at the valid positions
                flat.update(flatten_errors(value, f"{prefix}.{index}" if prefix else str(index)))
    else:
        items = detail if isinstance(detail, list) else [detail]
        flat.setdefault(prefix or NON_FIELD, []).extend(str(item) for item in items)
    return flat


def validation_summary(errors):
    field, messages = next(iter(errors.items()))
    if field == NON_FIELD:
        return messages[0]
    return f"{field}: {messages[0]}"


def django_error_detail(exc):
    """A Django ValidationError as DRF detail; its ``__all__`` becomes ``non_field_errors``."""
    if not hasattr(exc, "error_dict"):
        return {NON_FIELD: exc.messages}
    return {
        (NON_FIELD if field == NON_FIELD_ERRORS else field): messages
        for field, messages in exc.message_dict.items()
    }


class RequestTooLarge(exceptions.APIException):
    status_code = 413
    default_detail = "The request body is larger than this server accepts."
    default_code = "request_too_large"


def exception_handler(exc, context):
    """REST_FRAMEWORK["EXCEPTION_HANDLER"]: every exception a view raises -> a problem."""
    request = context.get("request")
    instance = request.path if request is not None else ""
    if isinstance(exc, RequestDataTooBig):
        exc = RequestTooLarge(
            f"The request body is larger than this server accepts "
            f"({settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes)."
        )
    if isinstance(exc, DjangoValidationError):
        # Domain code (recovery.replay.jobs, recovery.replay) raises Django's ValidationError.
        exc = exceptions.ValidationError(django_error_detail(exc))
    response = drf_exception_handler(exc, context)
    if response is None:
        log.exception("API error on %s", instance, exc_info=exc)
        set_rollback()
        return Response(
            problem(500, "Internal error; it has been logged.", "server_error", instance),
            status=500,
            content_type=PROBLEM_CONTENT_TYPE,
        )
    errors = None
    if isinstance(exc, exceptions.ValidationError):
        errors = flatten_errors(exc.detail) or {NON_FIELD: ["Invalid input."]}
        detail, code = validation_summary(errors), "invalid"
    elif isinstance(exc, exceptions.APIException):
        detail = exc.detail if not isinstance(exc.detail, dict | list) else str(exc.detail)
        code = getattr(exc.detail, "code", None) or exc.default_code
    else:  # Http404 / PermissionDenied, already turned into a response by DRF
        detail = response.data.get("detail", "") if isinstance(response.data, dict) else ""
        code = "not_found" if response.status_code == 404 else "permission_denied"
    response.data = problem(response.status_code, detail, code, instance, errors)
    response.content_type = PROBLEM_CONTENT_TYPE
    return response


def _is_api(request):
    return request.path.startswith("/api/")


@csrf_exempt  # a POST to a missing URL is a 404, not a CSRF failure (there is no view to guard)
def api_not_found(request, path=""):
    """The last /api/ URL: an unknown endpoint is a problem+json 404 whatever DEBUG says
    (handler404 only runs with DEBUG off; Django's HTML debug page is no answer for a client)."""
    return handler404(request)


def handler404(request, exception=None):
    """console.urls.handler404: problem+json under /api/, Django's page elsewhere."""
    if _is_api(request):
        return JsonResponse(
            problem(404, "No such API endpoint.", "not_found", request.path),
            status=404,
            content_type=PROBLEM_CONTENT_TYPE,
        )
    return defaults.page_not_found(request, exception)


def handler500(request):
    if _is_api(request):
        return JsonResponse(
            problem(500, "Internal error; it has been logged.", "server_error", request.path),
            status=status.HTTP_500_INTERNAL_SERVER_ERROR,
            content_type=PROBLEM_CONTENT_TYPE,
        )
    return defaults.server_error(request)
