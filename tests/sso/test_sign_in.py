"""Signing in through a real OpenID Connect provider (tests/sso/provider: npm's oidc-provider)
with Django's test client on the console's side: users created at first sign-in, groups mapped
to role and team at every sign-in, refusals with a page and an activity row, API tokens of a
user the provider no longer maps, logout at the provider."""

from urllib.parse import parse_qs, urlparse

import pytest
from django.contrib.auth import get_user_model

from recovery.models import (
    Activity,
    ApiToken,
    GroupMapping,
    Membership,
    Role,
    SsoIdentity,
    global_role_of,
    role_of,
)
from tests.sso.fixtures import PROVIDER_NAME, provider_sign_in

pytestmark = pytest.mark.django_db


@pytest.fixture
def admins_mapped():
    GroupMapping.objects.create(group="platform-admins", role="admin")


def test_first_sign_in_creates_the_user_in_their_mapped_team(client, sso, payments):
    answer = provider_sign_in(client, "alice")
    assert answer.status_code == 302 and answer["Location"] == "/"
    alice = get_user_model().objects.get(username="alice")
    assert not alice.has_usable_password()
    assert alice.email == "alice@example.test"
    identity = SsoIdentity.objects.get(user=alice)
    assert (identity.issuer, identity.subject) == (sso.issuer, "alice")
    assert identity.groups == ["payments-oncall", "staff"]
    assert list(Membership.objects.filter(user=alice).values_list("team__name", "role")) == [
        ("payments", "operator")
    ]
    assert role_of(alice) == Role.OPERATOR
    overview = client.get("/")
    assert overview.status_code == 200
    assert (
        b"alice" in overview.content and b'<span class="role">operator</span>' in overview.content
    )
    changed = Activity.objects.get(action="sso_roles_changed", user=alice)
    assert changed.detail["after"] == {"role": None, "teams": {"payments": "operator"}}


def test_mapping_is_applied_at_every_sign_in(client, sso, payments, admins_mapped):
    provider_sign_in(client, "alice")
    alice = get_user_model().objects.get(username="alice")
    assert role_of(alice) == Role.OPERATOR

    # The provider's admin moves alice to the platform admins: next sign-in, she is a global
    # admin and no longer in payments.
    sso.set_groups("alice", ["platform-admins"])
    client.logout()
    assert provider_sign_in(client, "alice").status_code == 302
    assert global_role_of(alice) == Role.ADMIN
    assert not Membership.objects.filter(user=alice).exists()

    # A Lazarus admin maps "staff" to viewer in payments and alice is back in both groups.
    GroupMapping.objects.create(group="staff", team=payments, team_role="viewer")
    sso.set_groups("alice", ["staff"])
    client.logout()
    provider_sign_in(client, "alice")
    assert global_role_of(alice) is None
    assert list(Membership.objects.filter(user=alice).values_list("role", flat=True)) == ["viewer"]
    assert get_user_model().objects.filter(username="alice").count() == 1


def test_an_unmapped_group_is_refused_with_a_page_and_an_activity_row(client, sso, payments):
    answer = provider_sign_in(client, "carol")
    assert answer.status_code == 403
    page = answer.content.decode()
    assert "Sign-in refused" in page
    assert "None of your groups" in page and "marketing" in page
    assert not get_user_model().objects.filter(username="carol").exists()
    refusal = Activity.objects.get(action="login_refused")
    assert refusal.detail["username"] == "carol"
    assert refusal.detail["groups"] == ["marketing"]
    assert "_auth_user_id" not in client.session


def test_a_user_removed_from_the_group_loses_role_team_and_tokens(client, sso, payments, caplog):
    provider_sign_in(client, "alice")
    alice = get_user_model().objects.get(username="alice")
    _token, raw = ApiToken.issue(alice, name="cli")
    api = client.get("/api/v1/messages", HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert api.status_code == 200  # the token works while she is mapped

    sso.set_groups("alice", ["staff"])
    client.logout()
    answer = provider_sign_in(client, "alice")
    assert answer.status_code == 403
    assert not Membership.objects.filter(user=alice).exists()
    assert role_of(alice) is None
    assert ApiToken.authenticate(raw) is None
    from django.test import Client

    assert Client().get("/api/v1/messages", HTTP_AUTHORIZATION=f"Bearer {raw}").status_code == 401
    refusal = Activity.objects.get(action="login_refused", user=alice)
    assert refusal.detail["revoked_tokens"] == 1
    assert "sign-in refused for 'alice'" in caplog.text


def test_missing_groups_claim_is_refused_and_says_which_claim(client, sso, payments, caplog):
    answer = provider_sign_in(client, "dave")
    assert answer.status_code == 403
    assert "sent no &#x27;groups&#x27; claim" in answer.content.decode()
    assert Activity.objects.get(action="login_refused").detail["username"] == "dave"
    assert "sign-in refused for 'dave'" in caplog.text


def test_a_local_account_of_the_same_name_is_not_taken_over(client, sso, payments):
    local = get_user_model().objects.create_user("alice", password="pw-alice")
    answer = provider_sign_in(client, "alice")
    assert answer.status_code == 403
    assert "exists already" in answer.content.decode()
    assert not SsoIdentity.objects.exists()
    assert not Membership.objects.filter(user=local).exists()


def test_a_deactivated_user_is_refused(client, sso, payments):
    provider_sign_in(client, "alice")
    alice = get_user_model().objects.get(username="alice")
    alice.is_active = False
    alice.save()
    client.logout()
    answer = provider_sign_in(client, "alice")
    assert answer.status_code == 403
    assert "deactivated" in answer.content.decode()


def test_next_is_kept_across_the_provider(client, sso, payments):
    start = client.get("/sso/login/?next=/jobs/")
    from tests.sso.fixtures import ProviderLogin

    callback = ProviderLogin().sign_in(start["Location"], "alice")
    answer = client.get(callback.removeprefix("http://testserver"))
    assert answer["Location"] == "/jobs/"
    # A next elsewhere is dropped.
    client.logout()
    start = client.get("/sso/login/?next=https://evil.example/")
    callback = ProviderLogin().sign_in(start["Location"], "alice")
    assert client.get(callback.removeprefix("http://testserver"))["Location"] == "/"


def test_the_authorization_request_uses_pkce_and_a_nonce(client, sso):
    start = client.get("/sso/login/")
    query = parse_qs(urlparse(start["Location"]).query)
    assert query["code_challenge_method"] == ["S256"]
    assert len(query["code_challenge"][0]) >= 43
    assert query["nonce"] and query["state"]
    assert query["scope"] == ["openid profile email groups"]
    assert query["redirect_uri"] == ["http://testserver/sso/callback"]


def test_logout_ends_the_provider_session_too(client, sso, payments):
    provider_sign_in(client, "alice")
    id_token = client.session["sso_id_token"]
    answer = client.post("/logout/")
    assert "_auth_user_id" not in client.session
    location = urlparse(answer["Location"])
    assert f"{location.scheme}://{location.netloc}" == sso.issuer
    assert location.path == "/session/end"
    query = parse_qs(location.query)
    assert query["id_token_hint"] == [id_token]
    assert query["post_logout_redirect_uri"] == ["http://testserver/login/"]
    assert client.get("/").status_code == 302  # logged out of Lazarus


def test_the_login_page_offers_the_provider(client, sso):
    page = client.get("/login/").content.decode()
    assert f"Sign in with {PROVIDER_NAME}" in page
    assert 'href="/sso/login/"' in page
    page = client.get("/login/?next=/jobs/").content.decode()
    assert 'href="/sso/login/?next=/jobs/"' in page


def test_the_logout_redirect_to_the_provider_is_allowed_by_the_csp(client, sso, settings):
    """The logout form's POST is redirected to the provider: form-action allows its origin
    (and only with single sign-on on)."""
    policy = client.get("/login/")["Content-Security-Policy"]
    assert f"form-action 'self' {sso.issuer};" in policy
    settings.OIDC_ISSUER = ""
    assert "form-action 'self';" in client.get("/login/")["Content-Security-Policy"]


def test_groups_from_the_userinfo_endpoint(client, start_provider, payments):
    """A provider that keeps the username and groups out of the id token (userinfo only):
    Lazarus asks the userinfo endpoint with the access token."""
    from tests.sso.fixtures import sso_on

    provider = start_provider(conformIdTokenClaims=True)
    with sso_on(provider):
        answer = provider_sign_in(client, "alice")
    assert answer.status_code == 302
    alice = get_user_model().objects.get(username="alice")
    assert alice.email == "alice@example.test"
    assert SsoIdentity.objects.get(user=alice).groups == ["payments-oncall", "staff"]
    assert role_of(alice) == Role.OPERATOR


def test_refusals_are_on_the_activity_page(client, sso, payments, admin_user):
    provider_sign_in(client, "carol")
    client.force_login(admin_user)
    page = client.get("/activity/?action=login_refused")
    assert page.status_code == 200
    text = page.content.decode()
    assert "login_refused" in text or "sign-in refused" in text
    assert "carol" in text and "marketing" in text
