"""Production settings pass `manage.py check --deploy` with nothing to report."""

import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from console.settings import DEVELOPMENT_SECRET_KEY

ROOT = Path(__file__).resolve().parents[2]

PRODUCTION = {
    "SECRET_KEY": secrets.token_urlsafe(50),
    "DEBUG": "false",
    "ALLOWED_HOSTS": "lazarus.example.com",
    "SECURE_SSL_REDIRECT": "true",
    "SECURE_HSTS_SECONDS": "31536000",
    "SECURE_HSTS_INCLUDE_SUBDOMAINS": "true",
    "SECURE_HSTS_PRELOAD": "true",
}


def check_deploy(**env):
    # The browser tests allow Django's ORM beside Playwright's event loop in this process; a
    # deployment must not, and the check says so.
    unset = {*PRODUCTION, "DJANGO_ALLOW_ASYNC_UNSAFE"}
    base = {k: v for k, v in os.environ.items() if k not in unset}
    return subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_production_settings_pass_the_deploy_check():
    result = check_deploy(**PRODUCTION)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


@pytest.mark.parametrize(
    ("missing", "check_id"),
    [("SECRET_KEY", "lazarus.E001"), ("SECURE_HSTS_SECONDS", "security.W004")],
)
def test_it_fails_without_a_production_setting(missing, check_id):
    env = {k: v for k, v in PRODUCTION.items() if k != missing}
    result = check_deploy(**env)
    assert result.returncode != 0
    assert check_id in result.stdout + result.stderr


def test_debug_true_fails_the_deploy_check():
    result = check_deploy(**{**PRODUCTION, "DEBUG": "true"})
    assert result.returncode != 0
    assert "security.W018" in result.stdout + result.stderr


def test_static_files_are_sent_with_nosniff(settings):
    """WhiteNoise serves /static/ behind the security middleware (make run uses --nostatic)."""
    from django.test import Client

    settings.WHITENOISE_USE_FINDERS = True  # no collectstatic in the test run
    response = Client().get("/static/console.css")
    assert response.status_code == 200
    assert response["X-Content-Type-Options"] == "nosniff"


def outside_the_tests(*args, **env):
    """``manage.py args`` as a deployment would run it: without the PYTEST_VERSION that
    pytest exports (the test suite's own licence to use the development key)."""
    unset = {*PRODUCTION, "DJANGO_ALLOW_ASYNC_UNSAFE", "PYTEST_VERSION"}
    base = {k: v for k, v in os.environ.items() if k not in unset}
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("key", [None, DEVELOPMENT_SECRET_KEY])
def test_it_refuses_to_start_on_the_development_key_with_debug_off(key):
    env = {"DEBUG": "false", **({"SECRET_KEY": key} if key else {})}
    result = outside_the_tests("check", **env)
    assert result.returncode == 1
    assert "ImproperlyConfigured: SECRET_KEY is not set (or is the published development key)" in (
        result.stderr
    )


def test_a_demo_with_debug_on_starts_on_the_development_key():
    result = outside_the_tests("check", DEBUG="true")
    assert result.returncode == 0, result.stderr
    assert "using the development key (DEBUG or tests only)" in result.stderr


def test_a_real_key_with_debug_off_starts():
    result = outside_the_tests("check", DEBUG="false", SECRET_KEY=PRODUCTION["SECRET_KEY"])
    assert result.returncode == 0, result.stderr
    assert "development key" not in result.stderr


def test_the_release_step_runs_the_deploy_check_first():
    release = next(
        line.removeprefix("release:").strip()
        for line in (ROOT / "Procfile").read_text().splitlines()
        if line.startswith("release:")
    )
    assert release.startswith("python manage.py check --deploy && python manage.py migrate ")
