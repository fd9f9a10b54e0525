"""The name lookup counts against a send's deadline (a unit test of the bound: a resolver that
hangs is stood in for by a getaddrinfo that sleeps; no real resolver can be made to hang here)."""

import socket
import threading
import time

import pytest

from recovery.alerts import outbound


def test_a_hung_name_lookup_ends_at_the_send_deadline(monkeypatch):
    released = threading.Event()

    def hung(*_args, **_kwargs):
        released.wait(30)
        raise socket.gaierror("never answered")

    monkeypatch.setattr(outbound.socket, "getaddrinfo", hung)
    started = time.monotonic()
    try:
        with pytest.raises(TimeoutError, match="did not resolve within the 0.5 s deadline"):
            outbound.post("http://hooks.example.invalid/x", b"{}", {}, deadline_seconds=0.5)
        assert time.monotonic() - started < 2
    finally:
        released.set()


def test_a_lookup_that_answers_in_time_is_used(monkeypatch):
    calls = []

    def quick(host, port, **kwargs):
        calls.append((host, port))
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]

    monkeypatch.setattr(outbound.socket, "getaddrinfo", quick)
    assert outbound.resolve("relay.internal", 8080, outbound.Deadline(1)) == ["127.0.0.1"]
    assert calls == [("relay.internal", 8080)]
