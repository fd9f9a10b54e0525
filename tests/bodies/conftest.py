"""Real schemas for the body tests: a .proto compiled by protoc (grpcio-tools) into a
FileDescriptorSet and message classes, an Avro schema, and a local schema registry."""

import pytest

from tests.helpers.bodies import AVRO_SCHEMA, Registry, compile_orders_proto


@pytest.fixture(scope="session")
def proto(tmp_path_factory):
    return compile_orders_proto(tmp_path_factory.mktemp("proto"))


@pytest.fixture
def registry():
    server = Registry({7: AVRO_SCHEMA})
    yield server
    server.close()


@pytest.fixture(autouse=True)
def fresh_registry_cache():
    from recovery.bodies import schemas

    schemas._registry_cache.clear()
