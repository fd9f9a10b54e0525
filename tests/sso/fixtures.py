"""A real OpenID Connect provider for the tests: tests/sso/provider/provider.js (npm's
oidc-provider, installed by scripts/setup.sh), a process of its own on a free local port, with
the users and groups of tests/sso/users.json (copied per provider, so a test may change
someone's groups by rewriting its copy).

``oidc_provider`` is the session's well-behaved provider; ``start_provider(**options)`` starts
another with a fault switched on (``clockOffsetSeconds``, ``idTokenTtlSeconds``,
``publishOtherKey``) and stops it after the test. ``sso_on(provider)`` points the console at a
provider (override_settings); ``ProviderLogin`` signs a user in at the provider's own login page
over HTTP, for the tests that drive the console with Django's test client.
"""

import json
import select
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from urllib.parse import urljoin, urlparse

import pytest
import requests
from django.test import override_settings

HERE = Path(__file__).resolve().parent
PROVIDER_DIR = HERE / "provider"
USERS = HERE / "users.json"
CLIENT_ID = "lazarus-console"
CLIENT_SECRET = "lazarus-console-test-secret"
PROVIDER_NAME = "Test IdP"


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Provider:
    """One oidc-provider process."""

    def __init__(self, workdir, **options):
        if not (PROVIDER_DIR / "node_modules" / "oidc-provider").is_dir():
            pytest.fail(
                f"{PROVIDER_DIR}/node_modules is missing: `make setup` installs it (npm ci)"
            )
        version = subprocess.run(
            ["node", "-p", "process.versions.node"], capture_output=True, text=True, check=True
        ).stdout.strip()
        if int(version.split(".")[0]) < 20:
            pytest.fail(f"Node.js {version} is too old for oidc-provider 9: install Node.js 20+")
        self.port = free_port()
        self.issuer = f"http://127.0.0.1:{self.port}"
        self.users_file = workdir / f"users-{self.port}.json"
        shutil.copy(USERS, self.users_file)
        config = {
            "port": self.port,
            "issuer": self.issuer,
            "usersFile": str(self.users_file),
            "allowLocalRedirects": True,
            "clients": [
                {
                    "client_id": CLIENT_ID,
                    "client_secret": CLIENT_SECRET,
                    "redirect_uris": ["http://testserver/sso/callback"],
                    "post_logout_redirect_uris": ["http://testserver/login/"],
                }
            ],
            **options,
        }
        self.config_file = workdir / f"provider-{self.port}.json"
        self.config_file.write_text(json.dumps(config))
        self.log_file = workdir / f"provider-{self.port}.log"
        self.process = None
        self.start()

    def start(self):
        with open(self.log_file, "ab") as log:
            self.process = subprocess.Popen(
                ["node", "provider.js", str(self.config_file)],
                cwd=PROVIDER_DIR,
                stdout=subprocess.PIPE,
                stderr=log,
            )
        ready, _, _ = select.select([self.process.stdout], [], [], 20)
        line = self.process.stdout.readline().decode() if ready else ""
        if not line.startswith("listening "):
            self.stop()
            pytest.fail(f"the test provider did not start: {self.log_file.read_text()[-2000:]}")

    def stop(self):
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def freeze(self):
        """SIGSTOP: the port still accepts connections, nothing answers (a hung provider)."""
        self.process.send_signal(signal.SIGSTOP)

    def thaw(self):
        self.process.send_signal(signal.SIGCONT)

    def reset_users(self):
        """Everyone's groups as tests/sso/users.json has them."""
        shutil.copy(USERS, self.users_file)

    def set_claims(self, username, **claims):
        """Adds a user at the provider, or changes their profile claims (preferred_username,
        email, email_verified, groups), as a user who edits their profile there would."""
        users = json.loads(self.users_file.read_text())
        users.setdefault(username, {"password": f"{username}-pw"}).update(claims)
        self.users_file.write_text(json.dumps(users))

    def set_groups(self, username, groups):
        """Changes a user's groups at the provider (``None``: no groups claim at all)."""
        users = json.loads(self.users_file.read_text())
        if groups is None:
            users[username].pop("groups", None)
        else:
            users[username]["groups"] = groups
        self.users_file.write_text(json.dumps(users))


def sso_on(provider, **overrides):
    values = {
        "OIDC_ISSUER": provider.issuer,
        "OIDC_CLIENT_ID": CLIENT_ID,
        "OIDC_CLIENT_SECRET": CLIENT_SECRET,
        "OIDC_SCOPES": ["openid", "profile", "email", "groups"],
        "OIDC_PROVIDER_NAME": PROVIDER_NAME,
        "OIDC_TIMEOUT_SECONDS": 3.0,
    }
    values.update(overrides)
    return override_settings(**values)


@pytest.fixture(scope="session")
def oidc_provider(tmp_path_factory):
    provider = Provider(tmp_path_factory.mktemp("oidc-provider"))
    yield provider
    provider.stop()


@pytest.fixture
def start_provider(tmp_path):
    started = []

    def start(**options):
        provider = Provider(tmp_path, **options)
        started.append(provider)
        return provider

    yield start
    for provider in started:
        provider.stop()


@pytest.fixture
def sso(oidc_provider):
    """The console signs in through the session's provider (its groups file reset)."""
    oidc_provider.reset_users()
    with sso_on(oidc_provider):
        yield oidc_provider


class ProviderLogin:
    """A user's browser at the provider, over plain HTTP (requests): follows the authorization
    redirect to the provider's login page, submits the username and password, and follows the
    provider's redirects until one leaves for the console's callback."""

    def __init__(self, callback_prefix="http://testserver/sso/callback"):
        self.http = requests.Session()
        self.callback_prefix = callback_prefix

    def _follow(self, response):
        for _ in range(10):
            if response.status_code not in (302, 303):
                return response
            location = urljoin(response.url, response.headers["Location"])
            if location.startswith(self.callback_prefix):
                return location
            response = self.http.get(location, allow_redirects=False, timeout=10)
        raise AssertionError("too many redirects at the provider")

    def sign_in(self, authorize_url, username, password=None):
        """The callback URL (with code and state) the provider sends the browser back to."""
        assert urlparse(authorize_url).path.endswith("/auth"), authorize_url
        page = self._follow(self.http.get(authorize_url, allow_redirects=False, timeout=10))
        if isinstance(page, str):
            return page  # the provider remembered the user: straight back
        assert "Sign in to the test provider" in page.text, page.text[:500]
        action = page.text.split('action="', 1)[1].split('"', 1)[0]
        answer = self.http.post(
            urljoin(page.url, action),
            data={"login": username, "password": password or f"{username}-pw"},
            allow_redirects=False,
            timeout=10,
        )
        callback = self._follow(answer)
        assert isinstance(callback, str), callback.text[:500]
        return callback


def provider_sign_in(client, username, password=None, login=None):
    """Django test client ``client`` signs in as ``username`` through the provider; the
    console's answer to the callback."""
    start = client.get("/sso/login/")
    assert start.status_code == 302, start.content[:500]
    login = login or ProviderLogin()
    callback = login.sign_in(start["Location"], username, password)
    return client.get(callback.removeprefix("http://testserver"))


def wait_until(predicate, timeout=10):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False
