"""Every way a sign-in goes wrong, against the real provider: a clear page, a log line, never a
500 (provider stopped or hung, wrong client secret, a token signed with a key the provider does
not publish, a wrong state or nonce, a clock-skewed id token, a code used twice)."""

import logging
import time
from urllib.parse import parse_qs, urlparse

import pytest
from django.contrib.auth import get_user_model

from recovery.models import GroupMapping, Team
from tests.sso.fixtures import ProviderLogin, provider_sign_in, sso_on

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def mapped(db):
    team = Team.objects.create(name="payments")
    GroupMapping.objects.create(group="payments-oncall", team=team, team_role="operator")


def assert_failed(answer, status, title, caplog):
    assert answer.status_code == status, answer.content[:1000]
    page = answer.content.decode()
    assert "Sign-in failed" in page and title in page, page
    assert "_auth_user_id" not in answer.wsgi_request.session
    assert f"sign-in failed: {title}" in caplog.text
    assert not get_user_model().objects.exists()


@pytest.mark.slow  # a provider process of its own, and waits for a timeout or restart
def test_provider_stopped(client, start_provider, caplog):
    provider = start_provider()
    provider.stop()
    with sso_on(provider):
        answer = client.get("/sso/login/")
    assert_failed(answer, 502, "The identity provider cannot be reached", caplog)
    assert provider.issuer in answer.content.decode()


@pytest.mark.slow  # a provider process of its own, and waits for a timeout or restart
def test_provider_hung_at_discovery_times_out(client, start_provider, caplog):
    provider = start_provider()
    provider.freeze()
    started = time.monotonic()
    with sso_on(provider, OIDC_TIMEOUT_SECONDS=1.0):
        answer = client.get("/sso/login/")
    assert time.monotonic() - started < 5
    assert_failed(answer, 504, "The identity provider did not answer in time", caplog)
    assert "within 1 seconds" in answer.content.decode()


@pytest.mark.slow  # a provider process of its own, and waits for a timeout or restart
def test_provider_hung_at_the_token_exchange_times_out(client, start_provider, caplog):
    provider = start_provider()
    with sso_on(provider, OIDC_TIMEOUT_SECONDS=1.0):
        start = client.get("/sso/login/")
        callback = ProviderLogin().sign_in(start["Location"], "alice")
        provider.freeze()
        answer = client.get(callback.removeprefix("http://testserver"))
    assert_failed(answer, 504, "The identity provider did not answer in time", caplog)


def test_wrong_client_secret(client, sso, caplog):
    with sso_on(sso, OIDC_CLIENT_SECRET="not-the-secret"):
        answer = provider_sign_in(client, "alice")
    assert answer.status_code == 502
    page = answer.content.decode()
    assert "refused Lazarus&#x27;s client credentials" in page
    assert "OIDC_CLIENT_SECRET" in page
    assert (
        "sign-in failed: The identity provider refused Lazarus's client credentials" in caplog.text
    )
    assert "invalid_client" in caplog.text


def test_token_signed_with_a_key_the_provider_does_not_publish(client, start_provider, caplog):
    provider = start_provider(publishOtherKey=True)
    with sso_on(provider):
        answer = provider_sign_in(client, "alice")
    assert_failed(answer, 502, "The id token is not signed by the identity provider", caplog)
    assert "BadSignatureError" in caplog.text


@pytest.mark.slow  # a provider process of its own, and waits for a timeout or restart
def test_rotated_keys_are_fetched_again(client, start_provider):
    """The flip side: a provider restarted with a new key (a new key id) is trusted once its
    published keys say so, without restarting Lazarus."""
    provider = start_provider(keyId="first")
    with sso_on(provider):
        assert provider_sign_in(client, "alice").status_code == 302
        client.logout()
        provider.stop()
        provider.config_file.write_text(
            provider.config_file.read_text().replace('"keyId": "first"', '"keyId": "second"')
        )
        provider.start()
        assert provider_sign_in(client, "alice").status_code == 302


def test_wrong_state(client, sso, caplog):
    start = client.get("/sso/login/")
    callback = ProviderLogin().sign_in(start["Location"], "alice")
    forged = callback.replace("state=", "state=forged")
    answer = client.get(forged.removeprefix("http://testserver"))
    assert_failed(answer, 400, "This sign-in does not belong to this browser session", caplog)
    assert "MismatchingStateError" in caplog.text


def test_answer_from_another_browser(client, sso, caplog):
    """The provider's answer to one browser's sign-in, opened in another browser (a link sent
    to a victim): that browser's session has no such state."""
    from django.test import Client

    start = client.get("/sso/login/")
    callback = ProviderLogin().sign_in(start["Location"], "alice")
    answer = Client().get(callback.removeprefix("http://testserver"))
    assert_failed(answer, 400, "This sign-in does not belong to this browser session", caplog)


def test_wrong_nonce(client, sso, caplog):
    """The id token's nonce is not the one this session sent: the nonce the session remembers
    is changed between the redirect and the answer (as a swapped token would look)."""
    start = client.get("/sso/login/")
    state = parse_qs(urlparse(start["Location"]).query)["state"][0]
    session = client.session
    key = next(k for k in list(session.keys()) if state in k)
    stored = session[key]
    stored["data"]["nonce"] = "not-the-nonce-that-was-sent"
    session[key] = stored
    session.save()
    callback = ProviderLogin().sign_in(start["Location"], "alice")
    answer = client.get(callback.removeprefix("http://testserver"))
    assert_failed(answer, 400, "The id token was not issued for this sign-in", caplog)


def test_clock_ahead_token_from_the_future(client, start_provider, caplog):
    provider = start_provider(clockOffsetSeconds=600)
    with sso_on(provider, OIDC_CLOCK_LEEWAY_SECONDS=60):
        answer = provider_sign_in(client, "alice")
    assert_failed(answer, 400, "The id token is dated in the future", caplog)
    assert "OIDC_CLOCK_LEEWAY_SECONDS (60 s)" in answer.content.decode()


def test_clock_behind_token_expired(client, start_provider, caplog):
    provider = start_provider(clockOffsetSeconds=-300, idTokenTtlSeconds=120)
    with sso_on(provider, OIDC_CLOCK_LEEWAY_SECONDS=60):
        answer = provider_sign_in(client, "alice")
    assert_failed(answer, 400, "The id token has expired already", caplog)


def test_skew_within_the_leeway_is_accepted(client, start_provider):
    provider = start_provider(clockOffsetSeconds=30)
    with sso_on(provider, OIDC_CLOCK_LEEWAY_SECONDS=60):
        assert provider_sign_in(client, "alice").status_code == 302


def test_a_code_used_twice(client, sso, caplog):
    start = client.get("/sso/login/")
    state = parse_qs(urlparse(start["Location"]).query)["state"][0]
    key = next(k for k in list(client.session.keys()) if state in k)
    remembered = client.session[key]
    callback = ProviderLogin().sign_in(start["Location"], "alice")
    assert client.get(callback.removeprefix("http://testserver")).status_code == 302
    # Replayed with the same session state (an attacker who also has the PKCE verifier).
    client.logout()
    session = client.session
    session[key] = remembered
    session.save()
    with caplog.at_level(logging.WARNING):
        answer = client.get(callback.removeprefix("http://testserver"))
    assert answer.status_code == 400
    assert "refused the sign-in code" in answer.content.decode()
    assert "invalid_grant" in caplog.text


def test_sso_off_by_default(client, settings):
    assert settings.OIDC_ISSUER == ""
    assert client.get("/sso/login/").status_code == 404
    assert client.get("/sso/callback?code=x&state=y").status_code == 404
    page = client.get("/login/").content.decode()
    assert "Sign in with" not in page and 'name="password"' in page


def test_no_username_claim(client, sso, caplog):
    with sso_on(sso, OIDC_USERNAME_CLAIM="employee_number"):
        answer = provider_sign_in(client, "alice")
    assert_failed(answer, 502, "The id token does not name the user", caplog)
    assert "employee_number" in answer.content.decode()


def test_the_provider_refuses_to_sign_in(client, sso, caplog):
    """The provider answers with an error instead of a code: here login_required, to a
    prompt=none request from a browser not signed in there."""
    start = client.get("/sso/login/")
    answer = ProviderLogin().http.get(
        start["Location"] + "&prompt=none", allow_redirects=False, timeout=10
    )
    callback = answer.headers["Location"]
    assert callback.startswith("http://testserver/sso/callback?error=login_required")
    answer = client.get(callback.removeprefix("http://testserver"))
    assert_failed(answer, 403, "The identity provider did not sign you in", caplog)
    assert "login_required" in answer.content.decode()


@pytest.mark.slow  # a provider process of its own, and waits for a timeout or restart
def test_logout_when_the_provider_cannot_be_reached(client, start_provider, caplog):
    """Signed in, then Lazarus restarts (its copy of the provider's discovery document is
    gone) while the provider is down: logged out of Lazarus all the same, and told."""
    from console import sso as sso_module

    provider = start_provider()
    with sso_on(provider):
        assert provider_sign_in(client, "alice").status_code == 302
        sso_module._clients.clear()
        provider.stop()
        answer = client.post("/logout/", follow=True)
    assert "_auth_user_id" not in client.session
    assert answer.redirect_chain[-1][0] == "/login/"
    assert "could not be reached to end your session there" in answer.content.decode()
    assert "logout: the provider's session was not ended" in caplog.text


def test_the_discovery_document_is_read_again_after_an_hour(client, sso):
    from console import sso as sso_module

    assert client.get("/sso/login/").status_code == 302
    provider = sso_module.client()
    assert provider.server_metadata["issuer"] == sso.issuer
    provider.server_metadata["_loaded_at"] -= sso_module.METADATA_MAX_AGE_SECONDS + 1
    provider.server_metadata["authorization_endpoint"] = "http://127.0.0.1:9/stale"
    assert client.get("/sso/login/")["Location"].startswith(f"{sso.issuer}/auth?")


def test_wrong_client_id_is_refused_by_the_provider_itself(client, sso):
    """What docs/security.md says: the provider shows its own error and never sends the browser
    back (it cannot trust the redirect URI of a client it does not know)."""
    with sso_on(sso, OIDC_CLIENT_ID="not-a-client"):
        start = client.get("/sso/login/")
    assert start.status_code == 302
    answer = ProviderLogin().http.get(start["Location"], allow_redirects=False, timeout=10)
    assert answer.status_code == 400
    assert "invalid_client" in answer.text
    assert "Location" not in answer.headers
