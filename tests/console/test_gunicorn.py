"""The production shape (#18): the real gunicorn with production settings (DEBUG off, WhiteNoise
after collectstatic) serves pages, static files and health endpoints with security headers."""

import os
import secrets
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from django.db import connection

from tests.helpers import free_port

ROOT = Path(__file__).resolve().parents[2]


class NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None  # a 3xx is the answer under test, not something to follow


OPENER = urllib.request.build_opener(NoRedirects)


def get(url):
    try:
        with OPENER.open(url, timeout=10) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


@pytest.fixture
def gunicorn(db, tmp_path):
    settings_db = connection.settings_dict
    port = free_port()
    env = {
        **{k: v for k, v in os.environ.items() if k != "DJANGO_ALLOW_ASYNC_UNSAFE"},
        "DEBUG": "false",
        "SECRET_KEY": secrets.token_urlsafe(50),
        "ALLOWED_HOSTS": "127.0.0.1",
        "DATABASE_URL": (
            f"postgresql://{settings_db['USER']}@{settings_db['HOST']}:{settings_db['PORT']}"
            f"/{settings_db['NAME']}"
        ),
        "PORT": str(port),
        "BIND_ADDRESS": "127.0.0.1",
        "WEB_CONCURRENCY": "2",
    }
    collected = subprocess.run(
        [sys.executable, "manage.py", "collectstatic", "--noinput", "-v", "0"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert collected.returncode == 0, collected.stderr
    log = (tmp_path / "gunicorn.log").open("wb")
    server = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "gunicorn"),
            "console.wsgi",
            "-c",
            "deploy/gunicorn.conf.py",
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if get(base + "/livez")[0] == 200:
                break
        except OSError:
            time.sleep(0.2)
    else:
        server.kill()
        pytest.fail((tmp_path / "gunicorn.log").read_text())
    yield base
    server.terminate()
    server.wait(timeout=30)
    log.close()


@pytest.mark.slow
def test_gunicorn_serves_the_console_with_production_settings(gunicorn):
    status, headers, body = get(gunicorn + "/login/")
    assert status == 200 and b"<form" in body
    assert headers["X-Frame-Options"] == "DENY"
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert "script-src 'self'" in headers["Content-Security-Policy"]
    assert headers["Referrer-Policy"] == "same-origin"

    status, headers, body = get(gunicorn + "/static/console.css")
    assert status == 200 and body
    assert headers["X-Content-Type-Options"] == "nosniff"

    status, _headers, _body = get(gunicorn + "/messages/")
    assert status == 302  # to the login page

    assert get(gunicorn + "/readyz")[0] == 200
    status, _headers, body = get(gunicorn + "/no-such-page")
    assert status == 404 and b"Traceback" not in body  # DEBUG is off
