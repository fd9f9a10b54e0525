"""Users and roles: admins create users, set roles, deactivate; every change is logged."""

import pytest
from django.contrib.auth import get_user_model
from django.test import Client, RequestFactory

from recovery.models import Activity, role_of
from tests.helpers import make_user


def login_request():
    """Client.login() authenticates without a request; django-axes (the login throttle) needs
    one to know the client address."""
    return RequestFactory().post("/login/")


pytestmark = pytest.mark.django_db


def test_an_admin_creates_a_user_with_a_role(client, admin_user):
    client.force_login(admin_user)
    response = client.post(
        "/users/", {"username": "carol", "password": "long-enough-pw", "role": "operator"}
    )
    assert response.status_code == 302
    carol = get_user_model().objects.get(username="carol")
    assert role_of(carol) == "operator"
    assert carol.check_password("long-enough-pw")
    entry = Activity.objects.get(action="user_created")
    assert (entry.user, entry.detail) == (admin_user, {"username": "carol", "role": "operator"})
    assert Client().login(request=login_request(), username="carol", password="long-enough-pw")


def test_bad_input_is_refused_with_a_reason(client, admin_user, viewer):
    client.force_login(admin_user)
    duplicate = client.post(
        "/users/", {"username": "VERA", "password": "long-enough-pw", "role": "viewer"}
    )
    short = client.post("/users/", {"username": "dan", "password": "x", "role": "viewer"})
    bad_role = client.post(
        "/users/", {"username": "eve", "password": "long-enough-pw", "role": "god"}
    )
    assert "A user with that name exists." in duplicate.content.decode()
    assert "too short" in short.content.decode()
    assert "Select a valid choice" in bad_role.content.decode()
    assert not get_user_model().objects.filter(username__in=["dan", "eve"]).exists()


def test_an_admin_changes_a_role(client, admin_user, viewer):
    client.force_login(admin_user)
    client.post(f"/users/{viewer.pk}/role", {"role": "operator"})
    assert role_of(viewer) == "operator"
    entry = Activity.objects.get(action="role_changed")
    assert entry.detail == {"username": "vera", "role": "operator", "previous": "viewer"}


def test_a_deactivated_user_is_logged_out_and_cannot_log_in(admin_user):
    victim = make_user("mallory", "operator")
    theirs = Client()
    theirs.force_login(victim)
    assert theirs.get("/messages/").status_code == 200
    admin = Client()
    admin.force_login(admin_user)

    admin.post(f"/users/{victim.pk}/active", {"active": "0"})

    assert theirs.get("/messages/").status_code == 302  # the session no longer authenticates
    assert not Client().login(request=login_request(), username="mallory", password="pw-mallory")
    assert Activity.objects.filter(action="user_deactivated").exists()
    admin.post(f"/users/{victim.pk}/active", {"active": "1"})
    assert Client().login(request=login_request(), username="mallory", password="pw-mallory")


def test_an_admin_cannot_lock_themselves_out(client, admin_user):
    client.force_login(admin_user)
    client.post(f"/users/{admin_user.pk}/active", {"active": "0"})
    client.post(f"/users/{admin_user.pk}/role", {"role": "viewer"})
    admin_user.refresh_from_db()
    assert admin_user.is_active and role_of(admin_user) == "admin"
    assert "cannot" in client.get("/users/").content.decode()
