"""Client library helpers: the management API calls, draining a queue, reading JSONL logs.

Other engineers run their suites against the same broker and server at the same time: the names
these tests use carry this process's pid (tests/client/conftest.py)."""

import base64
import json
import os
import urllib.error
import urllib.parse
import urllib.request

AMQP_BASE = os.environ.get("CLIENT_TEST_AMQP", "amqp://guest:guest@127.0.0.1:5672")


MANAGEMENT = os.environ.get("CLIENT_TEST_MANAGEMENT", "http://guest:guest@127.0.0.1:15672")


PG_ADMIN_DSN = os.environ.get("CLIENT_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")


class Management:
    """Just the management API calls these tests need."""

    def __init__(self, url=MANAGEMENT):
        parts = urllib.parse.urlparse(url)
        self.base = f"{parts.scheme}://{parts.hostname}:{parts.port}/api"
        token = base64.b64encode(f"{parts.username}:{parts.password}".encode()).decode()
        self.auth = f"Basic {token}"

    def request(self, method, path, payload=None):
        data = json.dumps(payload).encode() if payload is not None else None
        req = urllib.request.Request(self.base + path, data=data, method=method)
        req.add_header("Authorization", self.auth)
        req.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(req, timeout=10) as resp:
            body = resp.read()
        return json.loads(body) if body else None

    def connections_in(self, vhost):
        return self.request("GET", f"/vhosts/{urllib.parse.quote(vhost, safe='')}/connections")

    def close_connection(self, name):
        try:
            self.request("DELETE", f"/connections/{urllib.parse.quote(name, safe='')}")
        except urllib.error.HTTPError as exc:
            if exc.code != 404:  # closed already (the client was reconnecting)
                raise


def consume_n(channel, queue, expected, timeout=10):
    """Get ``expected`` messages from ``queue`` (acked), or fewer after ``timeout`` seconds."""
    got = []
    for method, properties, body in channel.consume(queue, inactivity_timeout=timeout):
        if method is None:
            break
        channel.basic_ack(method.delivery_tag)
        got.append((properties, body))
        if len(got) >= expected:
            break
    channel.cancel()
    return got


def read_jsonl(log_dir, role):
    rows = []
    for root, _dirs, files in os.walk(log_dir):
        for filename in files:
            if filename.startswith(role + "-") and filename.endswith(".jsonl"):
                with open(os.path.join(root, filename), encoding="utf-8") as handle:
                    rows.extend(json.loads(line) for line in handle)
    return rows
