"""One error format everywhere: application/problem+json with status, code, detail, errors."""

import pytest
from django.test import Client, RequestFactory
from rest_framework.exceptions import ValidationError

from recovery.api.errors import exception_handler, flatten_errors, handler404, handler500
from tests.helpers.api import make_message

PROBLEM = "application/problem+json"


def assert_problem(response, status, code):
    assert response.status_code == status, response.content
    assert response["Content-Type"] == PROBLEM
    body = response.json()
    assert body["status"] == status
    assert body["code"] == code
    assert body["type"] == "about:blank" and body["title"] and body["detail"]
    assert body["instance"] == response.wsgi_request.path
    return body


def test_401_403_404(api_as, viewer_api):
    assert_problem(api_as(None).get("/api/v1/messages"), 401, "not_authenticated")
    bad = api_as(None).get("/api/v1/messages", headers={"Authorization": "Token lz_wrong"})
    assert_problem(bad, 401, "authentication_failed")
    assert_problem(viewer_api.get("/api/v1/tokens"), 403, "permission_denied")
    assert_problem(viewer_api.get("/api/v1/messages/999999999"), 404, "not_found")
    assert_problem(viewer_api.get("/api/v1/no-such-thing"), 404, "not_found")


def test_filter_errors_name_each_field(viewer_api):
    response = viewer_api.get("/api/v1/messages", {"kind": "grue", "since": "yesterday-ish"})
    body = assert_problem(response, 400, "invalid")
    assert set(body["errors"]) == {"kind", "since"}
    assert body["detail"].startswith(("kind:", "since:"))


def test_bad_cursor_is_a_404_problem(viewer_api):
    assert_problem(viewer_api.get("/api/v1/messages", {"cursor": "garbage"}), 404, "not_found")


def test_405_415_and_malformed_json(operator_api, client):
    message = make_message()
    url = f"/api/v1/messages/{message.pk}/replay"
    assert_problem(operator_api.get(url), 405, "method_not_allowed")
    form = client.post(url, {"queue": "x"}, **operator_api.headers())  # multipart form
    assert_problem(form, 415, "unsupported_media_type")
    broken = client.post(
        url, "{not json", content_type="application/json", **operator_api.headers()
    )
    assert_problem(broken, 400, "parse_error")
    message.refresh_from_db()
    assert message.status == "pending" and message.replay_count == 0


def test_body_validation_names_nested_and_header_fields(operator_api):
    message = make_message()
    url = f"/api/v1/messages/{message.pk}/replay"
    body = assert_problem(operator_api.post(url, {"body_base64": "%%%"}), 400, "invalid")
    assert body["errors"] == {"body_base64": ["Not valid base64."]}
    body = assert_problem(operator_api.post(url, {"headers": {"big": 2**70}}), 400, "invalid")
    assert list(body["errors"]) == ["headers"]
    key = operator_api.post(url, {}, headers={"Idempotency-Key": "x" * 256})
    assert list(assert_problem(key, 400, "invalid")["errors"]) == ["Idempotency-Key"]


def test_flatten_errors_dots_nested_fields_and_keeps_non_field_errors():
    detail = ValidationError(
        {"target": {"exchange": ["Required."]}, "message_ids": {1: ["Not a number."]}}
    ).detail
    assert flatten_errors(detail) == {
        "target.exchange": ["Required."],
        "message_ids.1": ["Not a number."],
    }
    assert flatten_errors(ValidationError(["Pick one."]).detail) == {
        "non_field_errors": ["Pick one."]
    }


def test_an_unexpected_exception_is_a_logged_500_problem(caplog):
    request = RequestFactory().get("/api/v1/messages")
    response = exception_handler(RuntimeError("boom"), {"request": request})
    assert response.status_code == 500
    assert response.data["code"] == "server_error" and "boom" not in response.data["detail"]
    assert "boom" in caplog.text


def test_django_level_404_and_500_are_problems_under_api_only():
    factory = RequestFactory()
    api_404 = handler404(factory.get("/api/v2/x"), None)
    assert api_404.status_code == 404 and api_404["Content-Type"] == PROBLEM
    assert handler500(factory.get("/api/v1/x"))["Content-Type"] == PROBLEM
    assert handler404(factory.get("/messages/x"), None)["Content-Type"].startswith("text/html")


def test_non_ascii_base64_is_a_400_not_a_crash(operator_api):
    message = make_message()
    response = operator_api.post(f"/api/v1/messages/{message.pk}/replay", {"body_base64": "é"})
    assert response.status_code == 400
    assert response.json()["errors"] == {"body_base64": ["Not valid base64."]}


# ---- requests that used to be 500s (#20) -----------------------------------------------------


def test_a_body_over_the_upload_limit_is_a_413_problem(operator_api, client, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    message = make_message()
    response = client.post(
        f"/api/v1/messages/{message.pk}/replay",
        '{"body_text": "' + "x" * 5000 + '"}',
        content_type="application/json",
        **operator_api.headers(),
    )
    body = assert_problem(response, 413, "request_too_large")
    assert "1000 bytes" in body["detail"]
    message.refresh_from_db()
    assert message.replay_count == 0


def test_json_nested_thousands_deep_is_a_400_problem(operator_api, client):
    message = make_message()
    response = client.post(
        f"/api/v1/messages/{message.pk}/replay",
        '{"headers": ' + '{"a": ' * 5000 + "1" + "}" * 5001,
        content_type="application/json",
        **operator_api.headers(),
    )
    body = assert_problem(response, 400, "parse_error")
    assert "nested too deep" in body["detail"]


@pytest.mark.parametrize("debug", [True, False])
def test_a_missing_api_url_is_a_problem_with_debug_on_or_off(viewer_api, settings, debug):
    settings.DEBUG = debug
    for path in ("/api/v1/no-such-thing", "/api/v1/messages/", "/api/v2/messages"):
        assert_problem(viewer_api.get(path), 404, "not_found")
    # A POST too, CSRF checks on as for a real client (there is no view to protect), e.g. an
    # id that is not one.
    strict = Client(enforce_csrf_checks=True)
    response = strict.post(
        "/api/v1/messages/-1/replay", {}, content_type="application/json", **viewer_api.headers()
    )
    assert_problem(response, 404, "not_found")
