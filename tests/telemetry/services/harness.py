"""Running the instrumented services of tests/telemetry/services/ against the real broker (#47).

No Django here: a capture sink (an OTLP/HTTP endpoint that keeps the raw request bodies), the
RabbitMQ management calls the fault injections need, and the two services as child processes.
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

SERVICES = Path(__file__).parent
PY_SERVICE = SERVICES / "py_service.py"
NODE_SERVICE = SERVICES / "node" / "service.js"
MANAGEMENT_URL = os.environ.get("RABBITMQ_MANAGEMENT_URL", "http://guest:guest@127.0.0.1:15672")
AMQP_BASE = os.environ.get("RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")


# -- the capture sink ---------------------------------------------------------------------------


class CaptureSink:
    """An OTLP/HTTP trace endpoint on 127.0.0.1 that stores every request as it came."""

    def __init__(self):
        self.requests = []  # (path, content type, content encoding, raw body)
        self.lock = threading.Lock()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = read_body(self)
                with sink.lock:
                    sink.requests.append(
                        (
                            self.path,
                            self.headers.get("Content-Type", ""),
                            self.headers.get("Content-Encoding", ""),
                            body,
                        )
                    )
                json_reply = "json" in self.headers.get("Content-Type", "")
                reply = b"{}" if json_reply else b""
                self.send_response(200)
                self.send_header(
                    "Content-Type", "application/json" if json_reply else "application/x-protobuf"
                )
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self):
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()

    def decoded(self):
        """Every request as an ``ExportTraceServiceRequest``."""
        with self.lock:
            raw = list(self.requests)
        return [
            decode_request(body, content_type, encoding) for _, content_type, encoding, body in raw
        ]

    def otlp_json(self):
        """All requests merged into one OTLP JSON ``ExportTraceServiceRequest`` document."""
        return merge(to_otlp_json(request) for request in self.decoded())

    def spans(self):
        return list(iter_spans(self.otlp_json()))


def read_body(handler):
    """The request body, with a Content-Length or chunked: Node's OTLP exporters pipe a stream
    into the request, so they send ``Transfer-Encoding: chunked`` and no Content-Length."""
    if "chunked" not in handler.headers.get("Transfer-Encoding", "").lower():
        return handler.rfile.read(int(handler.headers.get("Content-Length") or 0))
    chunks = []
    while True:
        size = int(handler.rfile.readline().split(b";")[0].strip() or b"0", 16)
        if size == 0:
            while handler.rfile.readline() not in (b"\r\n", b"\n", b""):
                pass  # trailers
            return b"".join(chunks)
        chunks.append(handler.rfile.read(size))
        handler.rfile.readline()


def decode_request(body, content_type="application/x-protobuf", encoding=""):
    if encoding == "gzip":
        body = gzip.decompress(body)
    request = ExportTraceServiceRequest()
    if "json" in content_type:
        json_format.Parse(hex_ids_to_base64(body.decode()), request)
    else:
        request.ParseFromString(body)
    return request


# OTLP JSON differs from protobuf's JSON mapping in two ways: trace and span ids are hex, not
# base64, and enums are integers (https://opentelemetry.io/docs/specs/otlp/#json-protobuf-encoding).
ID_FIELDS = ("traceId", "spanId", "parentSpanId")


def _walk_ids(node, convert):
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ID_FIELDS and isinstance(value, str):
                node[key] = convert(value)
            else:
                _walk_ids(value, convert)
    elif isinstance(node, list):
        for item in node:
            _walk_ids(item, convert)


def hex_ids_to_base64(text):
    document = json.loads(text)
    _walk_ids(document, lambda v: base64.b64encode(bytes.fromhex(v)).decode() if v else v)
    return json.dumps(document)


def to_otlp_json(request):
    document = json_format.MessageToDict(request, use_integers_for_enums=True)
    _walk_ids(document, lambda v: base64.b64decode(v).hex() if v else v)
    return document


def merge(documents):
    merged = {"resourceSpans": []}
    for document in documents:
        merged["resourceSpans"].extend(document.get("resourceSpans", []))
    return merged


def attribute_value(value):
    (kind, inner), *_ = value.items() or [(None, None)]
    if kind == "intValue":
        return int(inner)
    if kind == "arrayValue":
        return [attribute_value(v) for v in inner.get("values", [])]
    return inner


def iter_spans(document):
    """Flat spans of an OTLP JSON document: dicts with the resource's and the span's attributes
    as plain ``{key: value}``."""
    for resource_spans in document.get("resourceSpans", []):
        resource = {
            a["key"]: attribute_value(a["value"])
            for a in resource_spans.get("resource", {}).get("attributes", [])
        }
        for scope_spans in resource_spans.get("scopeSpans", []):
            for span in scope_spans.get("spans", []):
                yield {
                    **span,
                    "scope": scope_spans.get("scope", {}),
                    "resource": resource,
                    "attributes": {
                        a["key"]: attribute_value(a["value"]) for a in span.get("attributes", [])
                    },
                }


# -- the broker ---------------------------------------------------------------------------------


def _management(method, path, body=None):
    parts = urllib.parse.urlsplit(MANAGEMENT_URL)
    url = f"{parts.scheme}://{parts.hostname}:{parts.port or 15672}/api/{path}"
    request = urllib.request.Request(
        url, method=method, data=json.dumps(body).encode() if body is not None else None
    )
    token = base64.b64encode(
        f"{parts.username or 'guest'}:{parts.password or 'guest'}".encode()
    ).decode()
    request.add_header("Authorization", f"Basic {token}")
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=10) as response:
        data = response.read()
    return json.loads(data) if data else None


def quoted(name):
    return urllib.parse.quote(name, safe="")


def put_vhost(vhost, user="guest"):
    _management("PUT", f"vhosts/{quoted(vhost)}", {})
    _management(
        "PUT",
        f"permissions/{quoted(vhost)}/{quoted(user)}",
        {"configure": ".*", "write": ".*", "read": ".*"},
    )


def delete_vhost(vhost):
    try:
        _management("DELETE", f"vhosts/{quoted(vhost)}")
    except urllib.error.HTTPError as error:
        if error.code != 404:
            raise


def connections(vhost):
    return _management("GET", f"vhosts/{quoted(vhost)}/connections") or []


def close_connection(name, reason="closed by the test (#47 fault injection)"):
    parts = urllib.parse.urlsplit(MANAGEMENT_URL)
    url = f"{parts.scheme}://{parts.hostname}:{parts.port or 15672}/api/connections/{quoted(name)}"
    request = urllib.request.Request(url, method="DELETE")
    token = base64.b64encode(
        f"{parts.username or 'guest'}:{parts.password or 'guest'}".encode()
    ).decode()
    request.add_header("Authorization", f"Basic {token}")
    request.add_header("X-Reason", reason)
    try:
        urllib.request.urlopen(request, timeout=10).close()
    except urllib.error.HTTPError as error:
        if error.code != 404:  # it went by itself
            raise


def queue(vhost, name):
    return _management("GET", f"queues/{quoted(vhost)}/{quoted(name)}")


def amqp_url(vhost):
    parts = urllib.parse.urlsplit(AMQP_BASE)
    return urllib.parse.urlunsplit(parts._replace(path="/" + quoted(vhost)))


def wait_until(predicate, timeout=15.0, interval=0.05, what="the condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


# -- the services -------------------------------------------------------------------------------


def service_command(language, role, **options):
    """The command line of a service: ``options`` as ``--key value`` (``key_name`` is
    ``--key-name``; True is a flag; a list repeats the option)."""
    if language == "python":
        command = [sys.executable, str(PY_SERVICE), role]
    elif language == "node":
        command = ["node", str(NODE_SERVICE), role]
    else:
        raise ValueError(language)
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            command.append(flag)
        elif value is False or value is None:
            continue
        elif isinstance(value, list | tuple):
            for item in value:
                command += [flag, str(item)]
        else:
            command += [flag, str(value)]
    return command


def start_service(language, role, **options):
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    return subprocess.Popen(
        service_command(language, role, **options),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(process, timeout=30):
    stdout, stderr = process.communicate(timeout=timeout)
    if process.returncode != 0:
        raise RuntimeError(f"{process.args[:3]} exited {process.returncode}:\n{stdout}\n{stderr}")
    return stdout, stderr


def read_record(path):
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
