"""Alert helpers: a real HTTP receiver, webhook channels and rules."""

import http.server
import json
import threading

from recovery.models import AlertRule, NotificationChannel


class Receiver:
    """A real HTTP server recording what it is sent; ``down`` answers 503."""

    def __init__(self, port=None):
        self.requests = []
        self.down = False
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.requests.append({"headers": dict(self.headers), "body": body})
                self.send_response(503 if receiver.down else 200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port or 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    def payloads(self):
        return [json.loads(r["body"]) for r in self.requests]


def webhook(url, name="ops hook"):
    return NotificationChannel.objects.create(name=name, kind="webhook", target=url)


def rule(kind, channels=(), **fields):
    r = AlertRule.objects.create(name=fields.pop("name", kind), kind=kind, **fields)
    r.channels.set(channels)
    return r
