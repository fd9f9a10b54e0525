"""Accounts (#20): logins cannot be guessed, passwords are checked, superusers are protected,
deactivation revokes API tokens for good."""

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from recovery.models import Activity, ApiToken
from tests.helpers import make_user

pytestmark = pytest.mark.django_db

PASSWORD = "correct horse battery staple"


@pytest.fixture
def alice():
    user = make_user("alice", "operator")
    user.set_password(PASSWORD)
    user.save()
    return user


@pytest.fixture
def admin_client(client):
    client.force_login(make_user("boss", "admin"))
    return client


def login(username, password, address="10.0.0.1"):
    return Client(REMOTE_ADDR=address).post("/login/", {"username": username, "password": password})


def test_wrong_passwords_lock_the_account_at_that_address_until_an_admin_unlocks_it(
    alice, admin_client
):
    statuses = [login("alice", "guess").status_code for _ in range(10)]
    assert statuses == [200] * 9 + [429]  # the form again with its error; the 10th locks
    assert login("alice", PASSWORD).status_code == 429  # locked at 10.0.0.1, right password too
    # Not from everywhere: alice at another address logs in (one mistyping colleague or one
    # guessing insider behind the office NAT does not lock the account out for its owner).
    assert login("alice", PASSWORD, address="10.0.0.2").status_code == 302

    page = admin_client.get("/users/").content.decode()
    assert "user <strong>alice</strong> from <strong>10.0.0.1</strong>" in page
    response = admin_client.post("/users/unlock", {"username": "alice", "ip_address": "10.0.0.1"})
    assert response.status_code == 302
    assert login("alice", PASSWORD).status_code == 302
    assert Activity.objects.filter(
        action="login_unlocked", detail__username="alice", detail__ip_address="10.0.0.1"
    ).exists()


def test_one_address_does_not_lock_out_everyone_behind_it_until_it_sprays(alice, settings):
    """Ten failures of ten usernames from one address (a VPN egress, an office NAT) lock nobody
    out there; past LOGIN_ADDRESS_FAILURE_LIMIT failures across usernames (#46) the address is
    slowed, not refused: alice, who never failed there, still logs in at once."""
    for n in range(10):
        login(f"nobody-{n}", "guess", address="10.9.9.9")
    assert login("alice", PASSWORD, address="10.9.9.9").status_code == 302
    settings.LOGIN_ADDRESS_FAILURE_LIMIT = 25
    for n in range(15):
        login(f"sprayed-{n}", "guess", address="10.9.9.9")
    assert login("alice", PASSWORD, address="10.9.9.9").status_code == 302
    assert login("alice", PASSWORD, address="10.0.0.3").status_code == 302


def test_a_hundred_random_usernames_from_an_office_lock_nobody_there_out(
    alice, admin_client, time_machine
):
    """#46 item 13: the default LOGIN_ADDRESS_FAILURE_LIMIT (100) of made-up usernames from the
    office NAT. Everyone behind it, break-glass superusers included, still logs in; what failed
    from there is slowed to one try per LOGIN_SLOWDOWN_SECONDS."""
    time_machine.move_to("2026-11-26 12:00:00+00:00", tick=False)
    root = get_user_model().objects.create_superuser("root", password=PASSWORD)
    for n in range(100):
        assert login(f"random-{n:03}", "guess", address="10.9.9.9").status_code == 200
    assert login("root", PASSWORD, address="10.9.9.9").status_code == 302
    assert login("alice", PASSWORD, address="10.9.9.9").status_code == 302
    # A username that failed from there waits: the guesser gets a try every 5 s per username.
    slowed = login("random-042", "guess", address="10.9.9.9")
    assert slowed.status_code == 429
    assert (
        "Too many failed logins from your address (10.9.9.9) for several accounts, so each "
        "account that failed from it may be tried once every 5 s: try again in 5 s."
    ) in slowed.content.decode()
    # alice mistypes once: she is slowed too, never locked.
    assert login("alice", "typo", address="10.9.9.9").status_code == 200
    assert login("alice", PASSWORD, address="10.9.9.9").status_code == 429
    page = admin_client.get("/users/").content.decode()
    assert "address <strong>10.9.9.9</strong> slowed: each user that failed from it" in page
    time_machine.shift(5)
    assert login("alice", PASSWORD, address="10.9.9.9").status_code == 302
    assert login("random-042", "guess", address="10.9.9.9").status_code == 200
    assert root.is_superuser


def test_one_wrong_password_from_each_of_ten_addresses_slows_the_account_but_never_locks_it(
    alice, admin_client, time_machine
):
    time_machine.move_to("2026-11-26 12:00:00+00:00", tick=False)
    for n in range(10):
        assert login("alice", "guess", address=f"10.1.0.{n}").status_code == 200
    # Its owner, at an address that has not failed, logs in at once.
    assert login("alice", PASSWORD, address="10.2.0.1").status_code == 302
    # Each failing address again at once: slowed, whatever the password (not even checked).
    again = [login("alice", PASSWORD, address=f"10.1.0.{n}") for n in range(10)]
    assert {r.status_code for r in again} == {429}
    assert "try again in 5 s" in again[3].content.decode()
    page = admin_client.get("/users/").content.decode()
    assert "user <strong>alice</strong> slowed: failures from 10 addresses" in page
    time_machine.shift(5)
    assert login("alice", PASSWORD, address="10.1.0.3").status_code == 302


def test_api_tokens_work_while_the_password_is_locked_out(alice, client):
    _token, raw = ApiToken.issue(alice)
    for _ in range(10):
        login("alice", "guess")
    assert login("alice", PASSWORD).status_code == 429
    response = client.get("/api/v1/me", HTTP_AUTHORIZATION=f"Token {raw}")
    assert response.status_code == 200, response.content


@pytest.mark.parametrize(
    ("password", "said"),
    [
        ("short", "too short"),
        ("password123", "too common"),
        ("83920174652910", "entirely numeric"),
        ("carol-the-operator", "too similar to the username"),
    ],
)
def test_new_users_get_djangos_password_validators(admin_client, password, said):
    response = admin_client.post(
        "/users/", {"username": "carol-the-operator", "password": password, "role": "viewer"}
    )
    assert response.status_code == 200
    assert said in response.content.decode()
    assert not get_user_model().objects.filter(username="carol-the-operator").exists()


def test_only_a_superuser_may_change_a_superuser(admin_client):
    root = get_user_model().objects.create_superuser("root", "", PASSWORD)
    admin_client.post(f"/users/{root.pk}/active", {"active": "0"})
    admin_client.post(f"/users/{root.pk}/role", {"role": "viewer"})
    root.refresh_from_db()
    assert root.is_active and root.is_superuser

    other_root = Client()
    other_root.force_login(get_user_model().objects.create_superuser("root2", "", PASSWORD))
    other_root.post(f"/users/{root.pk}/active", {"active": "0"})
    root.refresh_from_db()
    assert not root.is_active


@pytest.mark.parametrize("form", [{"active": "yes"}, {"active": "true"}, {}])
def test_the_active_field_is_validated(admin_client, alice, form):
    response = admin_client.post(f"/users/{alice.pk}/active", form, follow=True)
    assert "active must be 1 (reactivate) or 0 (deactivate)" in response.content.decode()
    alice.refresh_from_db()
    assert alice.is_active


def test_deactivation_revokes_tokens_and_reactivation_does_not_revive_them(
    admin_client, alice, client
):
    _token, raw = ApiToken.issue(alice)
    auth = {"HTTP_AUTHORIZATION": f"Token {raw}"}
    assert client.get("/api/v1/me", **auth).status_code == 200

    admin_client.post(f"/users/{alice.pk}/active", {"active": "0"})
    assert client.get("/api/v1/me", **auth).status_code == 401
    admin_client.post(f"/users/{alice.pk}/active", {"active": "1"})

    alice.refresh_from_db()
    assert alice.is_active
    assert client.get("/api/v1/me", **auth).status_code == 401
    assert Activity.objects.get(action="user_deactivated").detail["tokens_revoked"] == 1
