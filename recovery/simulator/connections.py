"""The simulator's own broker connections: named so it can find them, and closed on purpose.

Each connection carries a client-provided ``connection_name`` (``lazarus-simulate/<run>/...``)
set through the AMQP URL, so forced drops and crashes close exactly the simulator's connections
in its vhost, through the management API — never a collector's or another application's.
"""

import logging
import queue
import threading
import time
import urllib.parse

from recovery.errors import ManagementError

log = logging.getLogger(__name__)

PREFIX = "lazarus-simulate"
# New connections show up in the management API's listing after a short delay (~2 s on 3.10).
LISTING_WAIT_S = 10.0
LISTING_POLL_S = 0.2


def unreachable(exc):
    """Whether a ManagementError says the API did not answer at all (the management plugin
    restarting, a wrong URL): a fault that needs it cannot be injected now, which is the demo's
    loss, not an error to stop for. Any other answer (a 500 for a listed connection) still is."""
    return isinstance(exc, ManagementError) and "management API unreachable" in str(exc)


class FaultSkipped(Exception):
    """A forced drop or crash was not injected: the management API is unreachable."""


def named_url(base_url, vhost, connection_name):
    """``base_url`` switched to ``vhost`` with a client-provided connection name."""
    parts = urllib.parse.urlparse(base_url)
    query = urllib.parse.parse_qsl(parts.query)
    query = [(k, v) for k, v in query if k != "client_properties"]
    query.append(("client_properties", repr({"connection_name": connection_name})))
    return parts._replace(
        path="/" + urllib.parse.quote(vhost, safe=""), query=urllib.parse.urlencode(query)
    ).geturl()


class Connections:
    """Names and closes the connections of one simulator run."""

    def __init__(self, management, vhost, run_id):
        self.management = management
        self.vhost = vhost
        self.run_prefix = f"{PREFIX}/{run_id}/"
        # client connection name -> how many forced drops closed it (see close)
        self._dropped = {}
        self._lock = threading.Lock()

    def producer_name(self, index):
        return f"{self.run_prefix}producer/{index}"

    def consumer_name(self, group, slot, incarnation):
        return f"{self.run_prefix}consumer/{group}/{slot}.{incarnation}"

    def tap_name(self):
        return f"{self.run_prefix}tap"

    def listed(self):
        """{connection_name: server-side name} of this vhost's connections."""
        rows = self.management.request(
            "GET",
            f"/vhosts/{self.management.quote(self.vhost)}/connections"
            "?columns=name,client_properties",
        )
        return {
            (row.get("client_properties") or {}).get("connection_name"): row["name"]
            for row in rows or []
        }

    def _close(self, server_name):
        """Force-close one connection: True if this call closed it, False if it was gone."""
        try:
            self.management.request("DELETE", f"/connections/{self.management.quote(server_name)}")
        except ManagementError as exc:
            if "HTTP 404" in str(exc):  # gone already (it was reconnecting)
                return False
            # RabbitMQ answers 500 when the connection ends while it handles the DELETE (seen
            # once in a test run). Only connections this run closes end mid-run, so a 500 for
            # one that is no longer listed is this call's close; one still listed is an error.
            if "HTTP 500" in str(exc) and server_name not in self.listed().values():
                log.info("DELETE of %s answered 500, and it is gone: closed", server_name)
                return True
            raise
        return True

    def _listed_or_skip(self, fault):
        try:
            return self.listed()
        except ManagementError as exc:
            if unreachable(exc):
                raise FaultSkipped(f"{fault} not injected: {exc}") from exc
            raise

    def _close_or_skip(self, server_name, fault):
        try:
            return self._close(server_name)
        except ManagementError as exc:
            if unreachable(exc):
                raise FaultSkipped(f"{fault} not injected: {exc}") from exc
            raise

    def drop(self, wait=LISTING_WAIT_S):
        """Force-close every producer and consumer connection of this run; returns how many.

        Waits (up to ``wait``) until at least one is listed, so a drop early in a short run still
        happens. The taps are spared: their copies are the truth's dead-letter record.
        """
        targets = (self.run_prefix + "producer/", self.run_prefix + "consumer/")
        deadline = time.monotonic() + wait
        while True:
            names = [
                (client, server)
                for client, server in self._listed_or_skip("forced drop").items()
                if client and client.startswith(targets)
            ]
            if names or time.monotonic() >= deadline:
                break
            time.sleep(LISTING_POLL_S)
        closed = 0
        for client, server in names:
            if self._close_or_skip(server, "forced drop"):
                closed += 1
                with self._lock:
                    self._dropped[client] = self._dropped.get(client, 0) + 1
        return closed

    def _drops_of(self, connection_name):
        with self._lock:
            return self._dropped.get(connection_name, 0)

    def close(self, connection_name, wait=LISTING_WAIT_S):
        """Force-close one named connection (a consumer crashing). True if it was closed, by
        this call or by a forced drop that came meanwhile (a new connection is listed only
        after a few seconds, and a drop may take it first: the ack is lost just the same);
        False if it was never listed."""
        drops = self._drops_of(connection_name)
        deadline = time.monotonic() + wait
        while True:
            server = self._listed_or_skip("crash").get(connection_name)
            if server is not None and self._close_or_skip(server, "crash"):
                return True
            if self._drops_of(connection_name) > drops:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(LISTING_POLL_S)


class Dropper(threading.Thread):
    """Runs the forced drops off the publishing thread, so traffic keeps flowing into them (and
    a drop that waits for new connections to be listed does not pause the producers)."""

    def __init__(self, connections, observer):
        super().__init__(name="simulate-dropper", daemon=True)
        self.connections = connections
        self.observer = observer
        self._requests = queue.Queue()
        self._error = None

    def request(self):
        self._requests.put(True)

    def run(self):
        while self._requests.get() is not None:
            if self._error is None:
                try:
                    self.observer.dropped(self.connections.drop())
                except FaultSkipped as exc:
                    # The traffic goes on without this drop; the truth counts no closes for it.
                    self.observer.skipped(str(exc))
                except Exception as exc:  # reported by finish() in the simulator's thread
                    self._error = exc

    def finish(self):
        """Wait until every requested drop has happened; re-raise a drop's failure."""
        self._requests.put(None)
        self.join()
        if self._error is not None:
            raise self._error
