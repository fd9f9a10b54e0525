"""A small client of the RabbitMQ management HTTP API."""

import base64
import json
import urllib.error
import urllib.parse
import urllib.request

from django.conf import settings

from recovery.errors import ManagementError


class Management:
    """A small client of the RabbitMQ management HTTP API (policies, queues, vhosts, bindings)."""

    def __init__(self, url=None, timeout=10):
        parsed = urllib.parse.urlparse(url or settings.RABBITMQ_MANAGEMENT_URL)
        self.base = f"{parsed.scheme}://{parsed.hostname}:{parsed.port or 15672}{parsed.path}"
        self.base = self.base.rstrip("/") + "/api"
        user = urllib.parse.unquote(parsed.username or "guest")
        password = urllib.parse.unquote(parsed.password or "guest")
        self.auth = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        self.timeout = timeout

    def request(self, method, path, payload=None):
        data = json.dumps(payload).encode() if payload is not None else None
        req = urllib.request.Request(self.base + path, data=data, method=method)
        req.add_header("Authorization", self.auth)
        req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                body = resp.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:500]
            raise ManagementError(f"{method} {path}: HTTP {exc.code} {detail}") from exc
        except (urllib.error.URLError, OSError) as exc:
            raise ManagementError(f"{method} {path}: management API unreachable ({exc})") from exc
        return json.loads(body) if body else None

    def at(self, scheme, host, port):
        """The same credentials and timeout against another node's management API."""
        other = Management.__new__(Management)
        other.base = f"{scheme}://{host}:{port}/api"
        other.auth, other.timeout = self.auth, self.timeout
        return other

    @staticmethod
    def quote(name):
        return urllib.parse.quote(name, safe="")

    def put_vhost(self, vhost):
        self.request("PUT", f"/vhosts/{self.quote(vhost)}", {})

    def delete_vhost(self, vhost):
        try:
            self.request("DELETE", f"/vhosts/{self.quote(vhost)}")
        except ManagementError as exc:
            if "HTTP 404" not in str(exc):
                raise

    def grant(self, vhost, user):
        self.request(
            "PUT",
            f"/permissions/{self.quote(vhost)}/{self.quote(user)}",
            {"configure": ".*", "write": ".*", "read": ".*"},
        )

    def put_policy(self, vhost, name, pattern, definition, apply_to, priority=0):
        self.request(
            "PUT",
            f"/policies/{self.quote(vhost)}/{self.quote(name)}",
            {
                "pattern": pattern,
                "definition": definition,
                "apply-to": apply_to,
                "priority": priority,
            },
        )

    def policies(self, vhost):
        return self.request("GET", f"/policies/{self.quote(vhost)}")

    def queue(self, vhost, name):
        return self.request("GET", f"/queues/{self.quote(vhost)}/{self.quote(name)}")

    def queues(self, vhost=None):
        path = f"/queues/{self.quote(vhost)}" if vhost else "/queues"
        return self.request(
            "GET",
            path + "?columns=name,vhost,messages,messages_ready,"
            "messages_unacknowledged,consumers,type,policy,arguments,effective_policy_definition,"
            "exclusive,auto_delete,operator_policy,delivery_limit",
        )

    def bindings(self, vhost):
        return self.request("GET", f"/bindings/{self.quote(vhost)}")

    def overview(self):
        return self.request("GET", "/overview")


class CachedReads(Management):
    """A Management whose GETs are answered once each: one alert evaluation cycle asks the
    same questions (nodes, connections, a vhost's queues) for several rules."""

    def __init__(self, url=None, timeout=10):
        super().__init__(url, timeout)
        self._answers = {}

    def request(self, method, path, payload=None):
        if method != "GET":
            return super().request(method, path, payload)
        if path not in self._answers:
            try:
                self._answers[path] = (True, super().request(method, path, payload))
            except ManagementError as exc:
                self._answers[path] = (False, exc)
        ok, answer = self._answers[path]
        if not ok:
            raise answer
        return answer
