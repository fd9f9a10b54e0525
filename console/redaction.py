"""Credentials never leave the process in an error page or a log line, whatever DEBUG says.

The broker and database settings are URLs with a password in them (``amqp://user:pass@host``).
Django's debug page masks settings whose *names* look secret (KEY, PASS, TOKEN, ...), not a
password inside ``RABBITMQ_URL``; the same URLs also reach request.META (runserver copies the
environment), frame variables and log records (a pika or psycopg error often quotes them).
Everything that shows text runs it through ``mask``.
"""

import logging
import re

from django.views.debug import SafeExceptionReporterFilter

# scheme://user:password@  ->  scheme://user:********@
_URL_PASSWORD = re.compile(r"(?P<head>\b[a-zA-Z][a-zA-Z0-9+.-]*://[^:/@\s'\"]*):[^@/\s'\"]+@")
# libpq's key=value form: password=secret
_DSN_PASSWORD = re.compile(r"(?P<head>\bpassword\s*=\s*)('[^']*'|\S+)", re.IGNORECASE)
MASK = "********"


def mask(text):
    """Text with the passwords of any URLs or libpq DSNs in it replaced by ********."""
    if not isinstance(text, str) or ("://" not in text and "password" not in text.lower()):
        return text
    text = _URL_PASSWORD.sub(lambda m: f"{m['head']}:{MASK}@", text)
    return _DSN_PASSWORD.sub(lambda m: f"{m['head']}{MASK}", text)


# Deeper than this a container is not walked (a list that holds itself would never end).
MAX_DEPTH = 20


def _masked(value, depth=0):
    if isinstance(value, str):
        return mask(value)
    if not isinstance(value, dict | list | tuple):
        return value
    if depth >= MAX_DEPTH:
        return f"{type(value).__name__} (nested too deep to show)"
    if isinstance(value, dict):
        return {key: _masked(item, depth + 1) for key, item in value.items()}
    items = [_masked(item, depth + 1) for item in value]
    if isinstance(value, list):
        return items
    # A named tuple's constructor takes its fields one by one, not an iterable: a frame
    # variable of one crashed the debug page, then logging (#46).
    return type(value)._make(items) if hasattr(value, "_make") else tuple(items)


class CredentialFilter(SafeExceptionReporterFilter):
    """DEFAULT_EXCEPTION_REPORTER_FILTER: Django's filter, plus passwords inside URLs."""

    def cleanse_setting(self, key, value):
        return _masked(super().cleanse_setting(key, value))

    def get_safe_request_meta(self, request):
        return _masked(super().get_safe_request_meta(request))

    def get_traceback_frame_variables(self, request, tb_frame):
        return [
            (name, _masked(value) if isinstance(value, str | dict | list | tuple) else value)
            for name, value in super().get_traceback_frame_variables(request, tb_frame)
        ]


class MaskCredentials(logging.Filter):
    """A logging filter (on every handler) that masks passwords in the formatted message."""

    def filter(self, record):
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a broken record is logging's business, not ours
            return True
        masked = mask(message)
        if masked != message:
            record.msg, record.args = masked, None
        if record.exc_info and not record.exc_text:
            record.exc_text = mask(logging.Formatter().formatException(record.exc_info))
        elif record.exc_text:
            record.exc_text = mask(record.exc_text)
        return True
