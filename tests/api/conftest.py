"""API test helpers: a token client that can send any header, and store rows built in code."""

import pytest

from tests.helpers import make_user
from tests.helpers.api import ApiClient


@pytest.fixture
def api_as(client):
    """``api_as(user)`` -> a client with a fresh token of that user; ``api_as(None)`` anonymous."""
    return lambda user: ApiClient(client, user)


@pytest.fixture
def viewer_api(api_as, db):
    return api_as(make_user("v", "viewer"))


@pytest.fixture
def operator_api(api_as, db):
    return api_as(make_user("o", "operator"))


@pytest.fixture
def app_queue(amqp):
    """A real application queue in the session vhost, empty."""
    name = "api.app.q"
    amqp.queue_declare(name, durable=True)
    amqp.queue_purge(name)
    return name


@pytest.fixture
def nobody(db):
    return make_user("nils", None)
