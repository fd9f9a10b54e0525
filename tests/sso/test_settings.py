"""The single sign-on settings are parsed strictly: a wrong value stops start-up naming it."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OIDC = {
    "OIDC_ISSUER": "https://idp.example.com/realms/ops",
    "OIDC_CLIENT_ID": "lazarus",
    "OIDC_CLIENT_SECRET": "s",
}


def settings_with(**env):
    base = {k: v for k, v in os.environ.items() if not k.startswith(("OIDC_", "LOCAL_LOGIN"))}
    code = (
        "import django; django.setup(); from django.conf import settings as s; "
        "print(s.OIDC_ISSUER, s.OIDC_SCOPES, s.LOCAL_LOGIN)"
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**base, "DJANGO_SETTINGS_MODULE": "console.settings", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_defaults_single_sign_on_off_passwords_for_all():
    result = settings_with()
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[0] == " ['openid', 'email', 'profile'] all"


def test_a_configured_provider_is_read():
    result = settings_with(**OIDC, OIDC_SCOPES="openid,profile groups", LOCAL_LOGIN="superusers")
    assert result.returncode == 0, result.stderr
    assert "['openid', 'profile', 'groups'] superusers" in result.stdout


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
def test_bad_values_stop_start_up(env, message):
    result = settings_with(**env)
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and message in result.stderr, result.stderr
