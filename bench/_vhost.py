"""A throwaway vhost for a benchmark run, so it never touches queues other people use."""

import base64
import contextlib
import json
import os
import urllib.parse
import urllib.request

AMQP_BASE = os.environ.get("BENCH_AMQP", "amqp://guest:guest@127.0.0.1:5672")
MANAGEMENT = os.environ.get("BENCH_MANAGEMENT", "http://guest:guest@127.0.0.1:15672")


def _request(method, path, payload=None):
    parts = urllib.parse.urlparse(MANAGEMENT)
    url = f"{parts.scheme}://{parts.hostname}:{parts.port}/api{path}"
    data = json.dumps(payload).encode() if payload is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    token = base64.b64encode(f"{parts.username}:{parts.password}".encode()).decode()
    req.add_header("Authorization", f"Basic {token}")
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=10):
        pass


@contextlib.contextmanager
def private_vhost(prefix):
    """Yields the AMQP URL of a fresh vhost, deleted (with its queues) afterwards."""
    name = f"{prefix}-{os.getpid()}"
    quoted = urllib.parse.quote(name, safe="")
    _request("PUT", f"/vhosts/{quoted}")
    everything = {"configure": ".*", "write": ".*", "read": ".*"}
    _request("PUT", f"/permissions/{quoted}/guest", everything)
    try:
        yield f"{AMQP_BASE}/{quoted}"
    finally:
        _request("DELETE", f"/vhosts/{quoted}")
