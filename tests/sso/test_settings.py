"""The single sign-on settings are parsed strictly: a wrong value stops start-up naming it.
console/settings.py runs as a fresh module (runpy) under each environment."""

import runpy
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

SETTINGS = Path(__file__).resolve().parents[2] / "console" / "settings.py"
OIDC = {
    "OIDC_ISSUER": "https://idp.example.com/realms/ops",
    "OIDC_CLIENT_ID": "lazarus",
    "OIDC_CLIENT_SECRET": "s",
}
NAMES = (
    "OIDC_ISSUER",
    "OIDC_CLIENT_ID",
    "OIDC_CLIENT_SECRET",
    "OIDC_SCOPES",
    "OIDC_TIMEOUT_SECONDS",
    "OIDC_CLOCK_LEEWAY_SECONDS",
    "LOCAL_LOGIN",
)


@pytest.fixture
def settings_with(monkeypatch):
    def load(**env):
        for name in NAMES:
            monkeypatch.delenv(name, raising=False)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        return runpy.run_path(str(SETTINGS))

    return load


@pytest.mark.filterwarnings("ignore:SECRET_KEY is not set")
def test_defaults_single_sign_on_off_passwords_for_all(settings_with):
    loaded = settings_with()
    assert loaded["OIDC_ISSUER"] == ""
    assert loaded["OIDC_SCOPES"] == ["openid", "email", "profile"]
    assert loaded["LOCAL_LOGIN"] == "all"
    assert "console.auth_backends.LocalLoginBackend" in loaded["AUTHENTICATION_BACKENDS"]


@pytest.mark.filterwarnings("ignore:SECRET_KEY is not set")
def test_a_configured_provider_is_read(settings_with):
    loaded = settings_with(**OIDC, OIDC_SCOPES="openid,profile groups", LOCAL_LOGIN="superusers")
    assert loaded["OIDC_ISSUER"] == OIDC["OIDC_ISSUER"]
    assert loaded["OIDC_SCOPES"] == ["openid", "profile", "groups"]
    assert loaded["LOCAL_LOGIN"] == "superusers"


@pytest.mark.filterwarnings("ignore:SECRET_KEY is not set")
@pytest.mark.parametrize(
    "env, message",
    [
        ({"LOCAL_LOGIN": "nobody"}, "LOCAL_LOGIN='nobody' is not all or superusers"),
        ({"OIDC_ISSUER": "https://idp.example.com"}, "OIDC_CLIENT_ID is required"),
        ({**OIDC, "OIDC_CLIENT_SECRET": ""}, "OIDC_CLIENT_SECRET is required"),
        ({**OIDC, "OIDC_ISSUER": "idp.example.com"}, "is not a URL with scheme http or https"),
        ({**OIDC, "OIDC_SCOPES": "profile email"}, "must include openid"),
        ({**OIDC, "OIDC_TIMEOUT_SECONDS": "0"}, "OIDC_TIMEOUT_SECONDS must be above 0"),
        ({**OIDC, "OIDC_CLOCK_LEEWAY_SECONDS": "-1"}, "below the minimum 0"),
    ],
)
def test_bad_values_stop_start_up(settings_with, env, message):
    with pytest.raises(ImproperlyConfigured, match=message.replace("(", r"\(")):
        settings_with(**env)
