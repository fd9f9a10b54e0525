"""Forced drops when the management API answers 500 (pure logic: a fake management API)."""

import pytest

from recovery.errors import ManagementError
from recovery.simulator.connections import Connections


class FakeManagement:
    """DELETE answers HTTP 500; the listing shows ``listed`` afterwards."""

    def __init__(self, listed):
        self.listed = listed

    def quote(self, text):
        return text

    def request(self, method, path, payload=None):
        if method == "DELETE":
            raise ManagementError(f"DELETE {path}: HTTP 500 ")
        return [
            {"name": server, "client_properties": {"connection_name": client}}
            for client, server in self.listed.items()
        ]


def test_a_500_for_a_connection_that_is_gone_counts_as_closed():
    connections = Connections(FakeManagement({}), "/", "run-1")
    assert connections._close("127.0.0.1:5000 -> 127.0.0.1:5672") is True


def test_a_500_for_a_connection_still_listed_is_an_error():
    listed = {"lazarus-simulate/run-1/producer/0": "127.0.0.1:5000 -> 127.0.0.1:5672"}
    connections = Connections(FakeManagement(listed), "/", "run-1")
    with pytest.raises(ManagementError, match="HTTP 500"):
        connections._close("127.0.0.1:5000 -> 127.0.0.1:5672")
