"""The OpenAPI schema is the contract: schemathesis drives every operation from it in-process
(WSGI, the test database, the session's RabbitMQ vhost) and checks each response against it.

Examples per operation: ``API_FUZZ_EXAMPLES`` (default 15: one to two minutes for the file).
"""

import os
import re

import pytest
import schemathesis
import yaml
from django.contrib.staticfiles import finders
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from console.wsgi import application
from recovery.models import AlertRule, ApiToken, NotificationChannel, Role
from tests.helpers import make_user
from tests.helpers.api import make_audit, make_message

EXAMPLES = int(os.environ.get("API_FUZZ_EXAMPLES", "15"))
# Reproducible by default; API_FUZZ_RANDOM=1 explores new inputs on each run.
DERANDOMIZE = os.environ.get("API_FUZZ_RANDOM", "") != "1"


@pytest.fixture
def wsgi_keeps_the_test_connection(db):
    # Django closes a connection that is not in autocommit at the end of each WSGI request; the
    # test database lives in a transaction, so do as Django's test client does: keep it open.
    for signal in (request_started, request_finished):
        signal.disconnect(close_old_connections)
    yield
    for signal in (request_started, request_finished):
        signal.connect(close_old_connections)


@pytest.fixture
def seeded(wired, wsgi_keeps_the_test_connection):
    """Objects for ids to point at, and an admin token (admins may call every operation)."""
    messages = [make_message(source_queue="fuzz.q") for _ in range(3)]
    make_message(status="discarded")
    audit = make_audit()
    admin = make_user("fuzz-admin", Role.ADMIN)
    token, raw = ApiToken.issue(admin)
    # A token the revoke operation may hit, so the fuzzer's own token stays valid.
    spare = ApiToken.issue(make_user("fuzz-spare", Role.VIEWER))[0]
    channel = NotificationChannel.objects.create(name="fuzz", kind="webhook", target="http://h/")
    rule = AlertRule.objects.create(name="fuzz", kind="open_messages")
    return {
        "headers": {"Authorization": f"Token {raw}"},
        "ids": {
            "messages": [m.pk for m in messages],
            "audits": [audit.pk],
            "tokens": [spare.pk],
            "alert-rules": [rule.pk],
            "alert-channels": [channel.pk],
        },
        "own_token": token.pk,
    }


# The live schema, served by the app itself (loading it needs no database). Not
# schemathesis.pytest.from_fixture: its lazy loader does not work with pytest 9.
schema = schemathesis.openapi.from_wsgi("/api/schema/", application)


@pytest.mark.slow  # a fuzzer: hundreds of generated requests
@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=DERANDOMIZE,
    suppress_health_check=list(HealthCheck),
)
def test_every_operation_conforms_to_the_schema(case, seeded):
    resource = case.path.split("/")[3]
    ids = seeded["ids"].get(resource)
    if ids and "id" in (case.path_parameters or {}):
        # Half the examples aim at real objects; the rest probe missing ones (404s).
        generated = case.path_parameters["id"]
        if isinstance(generated, int) and generated % 2 == 0:
            case.path_parameters["id"] = ids[generated // 2 % len(ids)]
    if resource == "tokens" and (case.path_parameters or {}).get("id") == seeded["own_token"]:
        case.path_parameters["id"] = seeded["ids"]["tokens"][0]
    # A request body the schema allows may still be refused when fields conflict (queue with
    # exchange, body_text with body_base64, a filter with message_ids), a header value cannot be
    # AMQP-encoded, or an alert rule's params do not fit its kind (PATCH too); OpenAPI cannot
    # state those rules, so "valid data accepted" is not asked of POSTs and PATCHes. Every other
    # check (no 5xx, status codes, content types, response bodies and headers, invalid data
    # rejected) applies to every operation.
    excluded = [positive_data_acceptance] if case.method in ("POST", "PATCH") else []
    case.call_and_validate(headers=seeded["headers"], excluded_checks=excluded)


@pytest.mark.django_db
def test_the_schema_names_security_and_the_error_format(client):
    document = yaml.safe_load(client.get("/api/schema/").content)
    assert document["components"]["securitySchemes"]["tokenAuth"]["in"] == "header"
    problem = document["components"]["schemas"]["Problem"]
    assert {"type", "title", "status", "detail", "code", "instance"} <= set(problem["required"])
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            assert {"tokenAuth": []} in operation["security"], (method, path)
            for code in ("401", "403", "429", "500"):
                content = operation["responses"][code]["content"]
                assert list(content) == ["application/problem+json"], (method, path, code)


@pytest.mark.django_db
def test_the_docs_page_loads_nothing_from_a_cdn(client):
    page = client.get("/api/docs/")
    assert page.status_code == 200
    html = page.content.decode()
    urls = re.findall(r"""(?:src|href)\s*=\s*["']([^"']+)["']""", html)
    urls += re.findall(r"""["'](https?://[^"']+)["']""", html)
    assert urls, "expected the page to reference its scripts"
    for url in urls:
        assert not url.startswith(("http:", "https:", "//")), url
    assets = [u for u in urls if u.startswith("/static/")]
    assert any("swagger-ui" in u for u in assets)
    for url in assets:
        assert finders.find(url.removeprefix("/static/").split("?")[0]), url
