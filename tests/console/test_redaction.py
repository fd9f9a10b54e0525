"""Passwords inside URL settings never reach an error page or a log line (#20)."""

import io
import logging
import sys

import pytest
from django.test import RequestFactory
from django.views.debug import technical_500_response

from console.redaction import MaskCredentials, mask

SECRET = "s3cret-Pw"


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ("amqp://guest:s3cret@h:5672/%2F", "amqp://guest:********@h:5672/%2F"),
        ("postgresql://lazarus:p%40ss@db/lazarus", "postgresql://lazarus:********@db/lazarus"),
        ("http://u:p@h and amqps://a:b@c", "http://u:********@h and amqps://a:********@c"),
        ("host=db password=hunter2 user=x", "host=db password=******** user=x"),
        ("postgresql://postgres@127.0.0.1/x", "postgresql://postgres@127.0.0.1/x"),
        ("no url here", "no url here"),
    ],
)
def test_mask(text, masked):
    assert mask(text) == masked


def test_the_debug_page_masks_passwords_in_settings_meta_and_variables(settings):
    settings.DEBUG = True
    settings.RABBITMQ_URL = f"amqp://guest:{SECRET}@127.0.0.1:5672/%2F"
    settings.CELERY_BROKER_URL = settings.RABBITMQ_URL
    settings.RABBITMQ_MANAGEMENT_URL = f"http://guest:{SECRET}@127.0.0.1:15672"
    request = RequestFactory().get("/boom", HTTP_X_BROKER=settings.RABBITMQ_URL)
    try:
        url = settings.RABBITMQ_MANAGEMENT_URL  # a frame variable holding the URL
        raise RuntimeError(f"cannot reach {url.split('@')[1]}")
    except RuntimeError:
        page = technical_500_response(request, *sys.exc_info()).content.decode()
    assert "RABBITMQ_URL" in page and "guest:********@127.0.0.1:5672" in page
    assert SECRET not in page


def test_log_lines_mask_passwords_in_messages_and_tracebacks():
    handlers = [
        handler
        for handler in logging.getLogger("recovery").handlers
        if any(isinstance(f, MaskCredentials) for f in handler.filters)
    ]
    assert handlers, "the recovery logger's handler has no MaskCredentials filter"
    handler = handlers[0]
    stream = handler.setStream(io.StringIO())
    try:
        log = logging.getLogger("recovery.test_redaction")
        log.error("cannot connect to %s", f"amqp://guest:{SECRET}@nowhere/")
        try:
            raise ConnectionError(f"postgresql://x:{SECRET}@db/lazarus refused")
        except ConnectionError:
            log.exception("database down")
        written = handler.stream.getvalue()
    finally:
        handler.setStream(stream)
    assert "amqp://guest:********@nowhere/" in written and "x:********@db" in written
    assert SECRET not in written


def test_djangos_own_loggers_use_the_masking_handler():
    handlers = logging.getLogger("django").handlers
    assert any(isinstance(f, MaskCredentials) for h in handlers for f in h.filters)
