"""Logins behind a real reverse proxy (Debian's nginx in front of live_server): with
LOGIN_PROXY_COUNT=1 each client is told apart by the address nginx saw, a forged
X-Forwarded-For buys nothing, and a lockout stays with the client that earned it. Clients
connect from different loopback addresses (127.0.0.2, 127.0.0.3, ...)."""

import http.client
import re
import shutil
import subprocess
import urllib.parse

import pytest
from axes.models import AccessAttempt

from tests.helpers import free_port, make_user, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
PASSWORD = "correct horse battery staple"


@pytest.fixture
def nginx(live_server, tmp_path):
    port = free_port()
    conf = tmp_path / "nginx.conf"
    conf.write_text(
        f"""
user root;
worker_processes 1;
daemon off;
pid {tmp_path}/nginx.pid;
error_log {tmp_path}/error.log;
events {{ worker_connections 64; }}
http {{
  access_log off;
  client_body_temp_path {tmp_path}/body;
  proxy_temp_path {tmp_path}/proxy;
  fastcgi_temp_path {tmp_path}/fastcgi;
  uwsgi_temp_path {tmp_path}/uwsgi;
  scgi_temp_path {tmp_path}/scgi;
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass {live_server.url};
      proxy_set_header Host $http_host;
      proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
    }}
  }}
}}
"""
    )
    process = subprocess.Popen([NGINX, "-c", str(conf), "-p", str(tmp_path)])
    try:
        wait_for(lambda: _up(port), message="nginx listening")
        yield port
    finally:
        process.terminate()
        process.wait(10)


def _up(port):
    try:
        http.client.HTTPConnection("127.0.0.1", port, timeout=1).request("HEAD", "/login/")
    except OSError:
        return False
    return True


def login(port, source, username, password, forwarded_for=None):
    """GET the form and POST it through nginx, connecting from ``source``; the status."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10, source_address=(source, 0))
    headers = {"X-Forwarded-For": forwarded_for} if forwarded_for else {}
    conn.request("GET", "/login/", headers=headers)
    page = conn.getresponse()
    html = page.read().decode()
    cookie = re.search(r"csrftoken=([^;]+)", page.getheader("Set-Cookie") or "").group(1)
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html).group(1)
    body = urllib.parse.urlencode(
        {"username": username, "password": password, "csrfmiddlewaretoken": token}
    )
    conn.request(
        "POST",
        "/login/",
        body=body,
        headers={
            **headers,
            "Content-Type": "application/x-www-form-urlencoded",
            "Cookie": f"csrftoken={cookie}",
        },
    )
    response = conn.getresponse()
    response.read()
    conn.close()
    return response.status


@pytest.fixture
def alice():
    user = make_user("alice", "operator")
    user.set_password(PASSWORD)
    user.save()
    return user


def test_behind_one_proxy_each_client_keeps_its_own_lockout(nginx, alice, settings):
    settings.LOGIN_PROXY_COUNT = 1
    statuses = [login(nginx, "127.0.0.2", "alice", "guess") for _ in range(10)]
    assert statuses == [200] * 9 + [429]
    assert login(nginx, "127.0.0.2", "alice", PASSWORD) == 429
    assert login(nginx, "127.0.0.3", "alice", PASSWORD) == 302  # another client: not locked
    # A client that forges the header is still known by the address nginx saw.
    assert login(nginx, "127.0.0.4", "alice", "guess", forwarded_for="127.0.0.3") == 200
    addresses = set(AccessAttempt.objects.values_list("ip_address", flat=True))
    assert addresses == {"127.0.0.2", "127.0.0.4"}


def test_without_the_proxy_setting_every_client_is_the_proxy(nginx, alice, settings):
    """What LOGIN_PROXY_COUNT=0 behind a proxy means: one address for everyone (the docs say to
    set it); the header is not trusted either way."""
    settings.LOGIN_PROXY_COUNT = 0
    for _ in range(10):
        login(nginx, "127.0.0.2", "alice", "guess", forwarded_for="198.51.100.9")
    assert login(nginx, "127.0.0.3", "alice", PASSWORD) == 429
    assert set(AccessAttempt.objects.values_list("ip_address", flat=True)) == {"127.0.0.1"}
