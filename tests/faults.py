"""Fault injection for tests: a TCP proxy in front of PostgreSQL or RabbitMQ.

Point the code under test at the proxy, then ``drop()`` every live connection (what a restart of
the service looks like from the client) or ``outage(seconds)`` (connections refused meanwhile).
The shared services themselves are never touched, so other test sessions on this machine keep
working. Tests that really restart a service are marked ``disruptive``.
"""

import contextlib
import socket
import threading
import time


class TcpProxy:
    def __init__(self, target_port, target_host="127.0.0.1"):
        self.target = (target_host, target_port)
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(128)
        self.port = self.listener.getsockname()[1]
        self.lock = threading.Lock()
        self.sockets = set()
        self.refusing = False
        self.closed = False
        self.accepted = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.refusing:
                client.close()
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()
                continue
            with self.lock:
                self.sockets.update((client, upstream))
                self.accepted += 1
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(src, dst), daemon=True).start()

    def _pipe(self, src, dst):
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            self._close(src)
            self._close(dst)

    def _close(self, sock):
        with self.lock:
            self.sockets.discard(sock)
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            sock.close()

    def drop(self):
        """Cut every live connection (both directions), as a service restart would."""
        with self.lock:
            victims = list(self.sockets)
        for sock in victims:
            self._close(sock)

    def outage(self, seconds):
        """Cut everything and refuse new connections for ``seconds``."""
        self.refusing = True
        self.drop()
        time.sleep(seconds)
        self.refusing = False

    def close(self):
        self.closed = True
        with contextlib.suppress(OSError):
            self.listener.close()
        self.drop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
