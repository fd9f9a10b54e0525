"""Who may see and do what in the console: login everywhere, viewers read only, CSRF on posts."""

import pytest
from django.test import Client

from tests.helpers import make_message, make_user

pytestmark = pytest.mark.django_db

PAGES = [
    "/",
    "/overview/live",
    "/messages/",
    "/messages/{pk}/",
    "/messages/{pk}/body",
    "/groups/",
    "/jobs/",
    "/activity/",
    "/history/",
    "/audits/",
]
OPERATOR_POSTS = [
    "/messages/{pk}/replay",
    "/messages/{pk}/discard",
    "/messages/{pk}/restore",
    "/messages/{pk}/edit",
    "/messages/bulk",
    "/messages/discard?status=pending",
    "/messages/restore?status=discarded",
    "/jobs/new",
]


@pytest.mark.parametrize(
    "path", PAGES + ["/users/", "/messages/{pk}/edit", "/messages/discard?status=pending"]
)
def test_it_sends_anonymous_visitors_to_login(client, path):
    message = make_message()
    response = client.get(path.format(pk=message.pk))
    assert response.status_code == 302
    assert response["Location"].startswith("/login/?next=")


@pytest.mark.parametrize("path", PAGES)
def test_it_shows_every_page_to_a_viewer(client, viewer, path):
    message = make_message()
    client.force_login(viewer)
    assert client.get(path.format(pk=message.pk)).status_code == 200


def test_a_viewer_sees_no_replay_edit_or_discard_controls(client, viewer):
    message = make_message()
    client.force_login(viewer)

    detail = client.get(f"/messages/{message.pk}/").content.decode()
    listing = client.get("/messages/").content.decode()

    for control in ('id="replay-button"', 'id="discard-button"', 'id="edit-link"', "/replay"):
        assert control not in detail
    for control in ('id="bulk-replay"', 'id="bulk-discard"', 'name="ids"'):
        assert control not in listing


def test_an_operator_sees_the_controls(client, operator):
    message = make_message()
    client.force_login(operator)
    detail = client.get(f"/messages/{message.pk}/").content.decode()
    listing = client.get("/messages/").content.decode()
    assert 'id="replay-button"' in detail and 'id="discard-button"' in detail
    assert 'id="bulk-replay"' in listing and f'value="{message.pk}"' in listing


@pytest.mark.parametrize("path", OPERATOR_POSTS)
def test_a_viewer_who_posts_anyway_is_refused(client, viewer, path):
    message = make_message()
    client.force_login(viewer)
    response = client.post(path.format(pk=message.pk), {"ids": [message.pk], "action": "replay"})
    assert response.status_code == 403
    message.refresh_from_db()
    assert (message.status, message.replay_count) == ("pending", 0)


def test_a_viewer_cannot_open_the_edit_form(client, viewer):
    message = make_message()
    client.force_login(viewer)
    assert client.get(f"/messages/{message.pk}/edit").status_code == 403


@pytest.mark.parametrize("path", ["/jobs/1/cancel", "/jobs/1/resume"])
def test_a_viewer_cannot_cancel_or_resume_jobs(client, viewer, path):
    client.force_login(viewer)
    assert client.post(path).status_code == 403


def test_a_user_without_a_role_sees_nothing(client):
    nobody = make_user("nobody", None)
    client.force_login(nobody)
    assert client.get("/messages/").status_code == 403
    assert client.get("/").status_code == 403


@pytest.mark.parametrize("persona", ["viewer", "operator"])
def test_only_admins_manage_users(client, request, persona):
    client.force_login(request.getfixturevalue(persona))
    assert client.get("/users/").status_code == 403
    assert client.post("/users/", {"username": "x", "password": "p"}).status_code == 403


def test_the_users_link_shows_for_admins_only(client, operator, admin_user):
    client.force_login(operator)
    assert 'href="/users/"' not in client.get("/").content.decode()
    client.force_login(admin_user)
    assert 'href="/users/"' in client.get("/").content.decode()


def test_a_post_without_the_csrf_token_is_refused(operator):
    message = make_message()
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)
    response = client.post(f"/messages/{message.pk}/discard", {"reason": "x"})
    assert response.status_code == 403
    message.refresh_from_db()
    assert message.status == "pending"


def test_htmx_posts_carry_the_csrf_token_in_a_header(operator):
    """base.html puts the token in hx-headers; a request with that header gets past CSRF."""
    client = Client(enforce_csrf_checks=True)
    client.force_login(operator)
    page = client.get("/messages/").content.decode()
    token = client.cookies["csrftoken"].value
    assert 'hx-headers=\'{"X-CSRFToken": "' in page
    response = client.post("/messages/bulk", {"action": "job", "ids": "1"}, HTTP_X_CSRFTOKEN=token)
    assert response.status_code == 302  # past CSRF, to the job form


def test_every_page_sends_the_content_security_policy(client, viewer):
    client.force_login(viewer)
    response = client.get("/")
    policy = response["Content-Security-Policy"]
    assert "script-src 'self'" in policy and "unsafe-inline" not in policy
    assert response["X-Frame-Options"] == "DENY"


def test_login_page_renders_and_logs_in(client, operator):
    page = client.get("/login/")
    assert page.status_code == 200
    response = client.post("/login/", {"username": "otto", "password": "pw-otto"})
    assert response.status_code == 302
    assert client.get("/").status_code == 200
