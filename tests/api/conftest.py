"""API test fixtures (the API client and the personas are tests/conftest.py's; the helpers
tests/helpers/api.py's)."""

import pytest


@pytest.fixture
def app_queue(amqp):
    """A real application queue in the session vhost, empty."""
    name = "api.app.q"
    amqp.queue_declare(name, durable=True)
    amqp.queue_purge(name)
    return name
