"""Fixtures of the firehose tests: tracing on in this session's test vhost only (never "/"),
turned off again in teardown (tracing costs the broker on every publish and delivery)."""

import pika
import pytest
from django.conf import settings

from recovery.broker.management import Management
from recovery.broker.trace import set_tracing


@pytest.fixture
def trace_dir(tmp_path, settings):
    settings.AUDIT_TRACE = str(tmp_path / "trace")
    settings.TRACE_FLUSH_SECONDS = 0.3
    return tmp_path / "trace"


@pytest.fixture
def traced(wired, trace_dir):
    """``wire --trace on`` for the test vhost, a fresh trace queue, tracing off afterwards."""
    from django.core.management import call_command

    assert wired != "/" and wired.startswith("lazarus-test-")
    management = Management()
    queue = settings.RECOVERY_TRACE_QUEUE
    connection = pika.BlockingConnection(pika.URLParameters(settings.RABBITMQ_URL))
    connection.channel().queue_delete(queue)
    connection.close()
    call_command("wire", "--trace", "on", "--vhost", wired)
    yield wired
    set_tracing(wired, False, management)
    connection = pika.BlockingConnection(pika.URLParameters(settings.RABBITMQ_URL))
    connection.channel().queue_delete(queue)
    connection.close()


@pytest.fixture
def tap(traced):
    """The tap of the traced test vhost, running (flushing every 0.3 s) until teardown."""
    from recovery.broker.trace_tap import start_taps, stop_taps

    stop_event, threads = start_taps([traced], flush_seconds=0.3)
    yield threads[0].tap
    stop_taps(stop_event, threads)
