"""One HTTP POST to a notification receiver, made as if the receiver were hostile (issue #29):

- one wall-clock deadline for the whole exchange (connect, TLS, request, status and headers):
  before every read or write the socket's timeout is set to what is left of it, so a receiver
  that drips a header every few seconds cannot hold a send past it (a per-read timeout would let
  it, one read at a time);
- redirects are never followed: a 3xx is a failed attempt naming where it pointed, so the
  signature headers never go to a host other than the target;
- only http and https, no credentials in the URL;
- the optional allow-list ``ALERTS_TARGET_ALLOW`` (host names, host:port, addresses or CIDR
  networks) is checked against the name and the addresses it resolves to, and the connection
  goes to an address that was checked (a name that resolves elsewhere a moment later cannot
  slip past it);
- the name lookup counts against the same deadline: getaddrinfo has no timeout of its own (a
  hung resolver holds it for the resolver's timeouts × attempts × search domains), so it runs
  on a small pool of lookup threads and the send gives up when the deadline passes (the thread
  finishes the lookup on its own and is reused).

The response body is never read: the status says whether the receiver took the notification.
A leaf module (no Django): console/settings.py checks ALERTS_TARGET_ALLOW with ``parse_allow``.
"""

import concurrent.futures
import functools
import http.client
import io
import ipaddress
import re
import socket
import ssl
import time
from urllib.parse import urljoin, urlsplit

# An allow-list entry that is not an address or network: a host name, optionally with a port.
HOST_ENTRY = re.compile(r"(?P<name>[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*)(?::(?P<port>[0-9]+))?")


class DeliveryError(Exception):
    """A failed attempt, with the reason shown on the notification and its channel."""


class Deadline:
    def __init__(self, seconds: float):
        self.seconds = seconds
        self.at = time.monotonic() + seconds

    def remaining(self) -> float:
        left = self.at - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no answer within the {self.seconds:g} s deadline")
        return left


# Lookups that outlive their send's deadline keep a thread until the resolver gives up: a few
# threads are enough for the sends in flight, and a lookup that cannot start in time fails too.
_LOOKUPS = concurrent.futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="alert-dns")


def resolve(host: str, port: int, deadline: Deadline) -> list[str]:
    """The addresses of ``host`` (deduplicated, in the resolver's order), or TimeoutError when
    the lookup does not answer within what is left of ``deadline``."""
    lookup = _LOOKUPS.submit(socket.getaddrinfo, host, port, type=socket.SOCK_STREAM)
    try:
        resolved = lookup.result(timeout=deadline.remaining())
    except concurrent.futures.TimeoutError:
        lookup.cancel()
        raise TimeoutError(
            f"the name {host} did not resolve within the {deadline.seconds:g} s deadline"
        ) from None
    return list(dict.fromkeys(str(info[4][0]) for info in resolved))


class _DeadlineSocket:
    """A connected socket whose every read and write may take only what is left of the deadline
    (http.client reads through ``makefile``; socket.SocketIO calls back ``recv_into``)."""

    def __init__(self, sock, deadline: Deadline):
        self._sock = sock
        self._deadline = deadline

    def _limit(self):
        self._sock.settimeout(self._deadline.remaining())

    def recv_into(self, buffer):
        self._limit()
        try:
            return self._sock.recv_into(buffer)
        except TimeoutError:
            raise TimeoutError(
                f"no answer within the {self._deadline.seconds:g} s deadline"
            ) from None

    def sendall(self, data, flags=0):
        self._limit()
        return self._sock.sendall(data, flags)

    def makefile(self, mode="rb", buffering=-1):
        return io.BufferedReader(socket.SocketIO(self, "rb"))  # type: ignore[arg-type]

    def _decref_socketios(self):
        pass

    def fileno(self):
        return self._sock.fileno()

    def close(self):
        self._sock.close()


@functools.cache
def _tls_context():
    # Loading the system's CA certificates takes a good part of a second: once per process.
    return ssl.create_default_context()


class _Connection(http.client.HTTPConnection):
    """An HTTP(S) connection to addresses already checked against the allow-list, under one
    deadline; ``host`` stays the URL's host (the Host header, TLS SNI and certificate check)."""

    def __init__(self, host, port, addresses, deadline, tls):
        super().__init__(host, port)
        self._addresses = addresses
        self._deadline = deadline
        self._tls = tls

    def connect(self):
        error = None
        for address in self._addresses:
            try:
                raw = socket.create_connection(
                    (address, self.port), timeout=self._deadline.remaining()
                )
            except TimeoutError:
                raise
            except OSError as exc:
                error = exc
                continue
            break
        else:
            raise error or OSError(f"no address for {self.host}")
        try:
            if self._tls:
                raw.settimeout(self._deadline.remaining())
                raw = _tls_context().wrap_socket(raw, server_hostname=self.host)
        except BaseException:
            raw.close()
            raise
        self.sock = _DeadlineSocket(raw, self._deadline)


def parse_allow(entries) -> list[tuple]:
    """ALERTS_TARGET_ALLOW's entries as ("net", network) or ("host", name, port or None);
    ValueError names an entry that is neither."""
    rules: list[tuple] = []
    for entry in entries:
        try:
            rules.append(("net", ipaddress.ip_network(entry, strict=False)))
            continue
        except ValueError:
            pass
        match = HOST_ENTRY.fullmatch(entry)
        if not match:
            raise ValueError(f"{entry!r} is not a host, host:port, address or network")
        name, port = match["name"], match["port"]
        rules.append(("host", name.lower(), int(port) if port else None))
    return rules


def permitted_addresses(host: str, port: int, addresses: list[str], allow: list) -> list[str]:
    """The addresses a send to host:port may connect to: all of them with no allow-list or when
    the name (with the port, where the entry has one) is listed; else those in a listed
    network."""
    if not allow:
        return addresses
    for rule in allow:
        if rule[0] == "host" and rule[1] == host.lower() and rule[2] in (None, port):
            return addresses
    return [
        address
        for address in addresses
        if any(rule[0] == "net" and ipaddress.ip_address(address) in rule[1] for rule in allow)
    ]


def where(url: str) -> str:
    """scheme://host[:port] of a URL: no path, query or credentials."""
    try:
        parts = urlsplit(url)
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "an unparsable URL"
    return f"{parts.scheme}://{parts.hostname or ''}{port}"


def post(url: str, body: bytes, headers: dict, deadline_seconds: float, allow=()) -> int:
    """POST ``body`` to ``url``; returns the 2xx status, raises DeliveryError for a refused
    target, a 3xx or an error status, and whatever the network raises (OSError, TimeoutError,
    http.client.HTTPException, ...) otherwise."""
    deadline = Deadline(deadline_seconds)
    if any(c <= " " or c == "\x7f" for c in url):
        raise DeliveryError("the target URL contains a space or a control character")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise DeliveryError(f"{parts.scheme or 'no'} scheme: only http and https targets are sent")
    if not parts.hostname:
        raise DeliveryError("the target URL has no host")
    if parts.username is not None or parts.password is not None:
        raise DeliveryError("the target URL carries credentials: they are never sent")
    tls = parts.scheme == "https"
    port = parts.port or (443 if tls else 80)
    addresses = resolve(parts.hostname, port, deadline)
    permitted = permitted_addresses(parts.hostname, port, addresses, parse_allow(allow))
    if not permitted:
        raise DeliveryError(
            f"{parts.hostname}:{port} ({', '.join(addresses)}) is not in ALERTS_TARGET_ALLOW"
        )
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    connection = _Connection(parts.hostname, port, permitted, deadline, tls)
    try:
        connection.request("POST", path, body, {"Content-Type": "application/json", **headers})
        response = connection.getresponse()
        status, location = response.status, response.getheader("Location") or ""
    finally:
        connection.close()
    if 300 <= status < 400:
        raise DeliveryError(
            f"HTTP {status} from {url}: a redirect (to {where(urljoin(url, location))}) is "
            "never followed; point the channel at the final address"
        )
    if not 200 <= status < 300:
        raise DeliveryError(f"HTTP {status} from {url}")
    return status
