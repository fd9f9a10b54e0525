"""Schema'd documents: Protocol Buffers from an uploaded FileDescriptorSet, Avro from an uploaded
schema or a Confluent-compatible schema registry. Each is a recovery.bodies.decode.Document:
parsed into a JSON-able value (protobuf's JSON mapping, Avro's records as objects), and
serialized back with the same schema, where a value that does not fit is a DecodeError naming
the field."""

import functools
import io
import json
import struct
import threading
import urllib.error
import urllib.request

import fastavro
from fastavro.validation import ValidationError as AvroValidationError
from google.protobuf import (
    descriptor_pb2,
    descriptor_pool,
    json_format,
    message_factory,
    unknown_fields,
)
from google.protobuf.message import DecodeError as ProtobufDecodeError

from recovery.bodies.decode import DecodeError, Document

CONFLUENT_MAGIC = 0


def descriptor_pool_from(descriptor_set):
    """A DescriptorPool from ``protoc --descriptor_set_out --include_imports`` output."""
    try:
        files = descriptor_pb2.FileDescriptorSet.FromString(bytes(descriptor_set))
    except ProtobufDecodeError as exc:
        raise DecodeError(f"not a FileDescriptorSet ({exc})") from exc
    if not files.file:
        raise DecodeError("the FileDescriptorSet describes no .proto file")
    pool = descriptor_pool.DescriptorPool()
    try:
        for proto in files.file:
            pool.Add(proto)
    except (TypeError, ValueError) as exc:
        raise DecodeError(
            f"the FileDescriptorSet does not load ({exc}): --include_imports?"
        ) from exc
    return pool


def message_types(pool, descriptor_set):
    """Every message type the set defines, fully qualified (for forms and errors)."""
    files = descriptor_pb2.FileDescriptorSet.FromString(bytes(descriptor_set))
    names = []
    for proto in files.file:
        prefix = f"{proto.package}." if proto.package else ""
        stack = [(prefix, m) for m in proto.message_type]
        while stack:
            outer, message = stack.pop()
            name = f"{outer}{message.name}"
            names.append(name)
            stack += [(f"{name}.", nested) for nested in message.nested_type]
    return sorted(names)


class ProtobufDocument(Document):
    def __init__(self, pool, type_name):
        self.type_name = type_name
        self.label = f"protobuf {type_name}"
        try:
            self.cls = message_factory.GetMessageClass(pool.FindMessageTypeByName(type_name))
        except KeyError as exc:
            raise DecodeError(f"no message type {type_name!r} in the descriptor set") from exc

    def parse(self, data):
        message = self.cls()
        try:
            message.ParseFromString(data)
        except ProtobufDecodeError as exc:
            raise DecodeError(f"not a {self.type_name} ({exc})") from exc
        # Protobuf keeps what it does not know as unknown fields: for a whole body that is the
        # sign of another message type, not of a newer writer, when the type knows none of it.
        unknown = sorted({field.field_number for field in unknown_fields.UnknownFieldSet(message)})
        if unknown:
            raise DecodeError(
                f"fields {unknown} are not in {self.type_name}: another message type, or a "
                "newer schema than the uploaded one?"
            )
        return json_format.MessageToDict(message, preserving_proto_field_name=True)

    def serialize(self, value):
        try:
            message = json_format.ParseDict(value, self.cls())
        except json_format.ParseError as exc:
            raise DecodeError(f"{self.type_name}: {exc}") from exc
        return message.SerializeToString()


@functools.lru_cache(maxsize=64)
def protobuf_document(descriptor_set, type_name):
    """A ProtobufDocument, built once per descriptor set and type (building the pool costs far
    more than decoding one body: the indexer decodes thousands per batch)."""
    return ProtobufDocument(descriptor_pool_from(descriptor_set), type_name)


@functools.lru_cache(maxsize=64)
def avro_document(schema_text):
    return AvroDocument(schema_text)


def parse_avro_schema(schema):
    """A parsed Avro schema from its JSON (text or object); DecodeError if it is not one."""
    try:
        return fastavro.parse_schema(json.loads(schema) if isinstance(schema, str) else schema)
    except (ValueError, TypeError, KeyError, fastavro.schema.SchemaParseException) as exc:
        raise DecodeError(f"not an Avro schema ({exc})") from exc


class AvroDocument(Document):
    """A bare Avro datum (schemaless) written with ``schema``."""

    def __init__(self, schema):
        self.schema = parse_avro_schema(schema)
        self.label = f"avro {self.schema.get('name', self.schema.get('type'))}"

    def parse(self, data):
        return _read_avro(data, self.schema)

    def serialize(self, value):
        return _write_avro(value, self.schema)


class RegistryAvroDocument(Document):
    """Confluent wire format: magic byte 0, a 4-byte schema id, then the Avro datum; the schema
    comes from ``GET {url}/schemas/ids/{id}`` (cached: an id's schema never changes)."""

    label = "avro (registry)"

    def __init__(self, url, timeout):
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.schema_id = None

    def parse(self, data):
        if len(data) < 5 or data[0] != CONFLUENT_MAGIC:
            raise DecodeError("not in the schema registry's wire format (magic byte 0, schema id)")
        (self.schema_id,) = struct.unpack(">I", data[1:5])
        schema = registry_schema(self.url, self.schema_id, self.timeout)
        self.label = f"avro {schema.get('name', schema.get('type'))} (registry id {self.schema_id})"
        return _read_avro(data[5:], schema)

    def serialize(self, value):
        schema = registry_schema(self.url, self.schema_id, self.timeout)
        return (
            bytes([CONFLUENT_MAGIC])
            + struct.pack(">I", self.schema_id)
            + _write_avro(value, schema)
        )


_registry_cache: dict = {}
_registry_lock = threading.Lock()


def registry_schema(url, schema_id, timeout):
    key = (url, schema_id)
    with _registry_lock:
        if key in _registry_cache:
            return _registry_cache[key]
    address = f"{url}/schemas/ids/{schema_id}"
    try:
        with urllib.request.urlopen(address, timeout=timeout) as response:  # noqa: S310 - admin's URL
            answer = json.loads(response.read(1024 * 1024))
    except urllib.error.HTTPError as exc:
        raise DecodeError(f"schema registry: schema id {schema_id} unknown ({exc.code})") from exc
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        reason = getattr(exc, "reason", exc)
        raise DecodeError(f"schema registry {url} unreachable ({reason})") from exc
    except ValueError as exc:
        raise DecodeError(f"schema registry answered no JSON ({exc})") from exc
    if not isinstance(answer, dict) or "schema" not in answer:
        raise DecodeError("schema registry answered without a schema")
    schema = parse_avro_schema(answer["schema"])
    with _registry_lock:
        _registry_cache[key] = schema
    return schema


def _read_avro(data, schema):
    reader = io.BytesIO(data)
    try:
        value = fastavro.schemaless_reader(reader, schema, None)
    except (EOFError, ValueError, IndexError, UnicodeDecodeError, struct.error) as exc:
        raise DecodeError(
            f"not an Avro {schema.get('name', 'datum')} ({type(exc).__name__}: {exc})"
        ) from exc
    if reader.tell() != len(data):
        raise DecodeError(
            f"{len(data) - reader.tell()} bytes left after the Avro datum: wrong schema?"
        )
    return _jsonable(value)


def _write_avro(value, schema):
    out = io.BytesIO()
    try:
        fastavro.validation.validate(value, schema, raise_errors=True)
        fastavro.schemaless_writer(out, schema, value)
    except AvroValidationError as exc:
        raise DecodeError(f"does not fit the Avro schema: {exc}") from exc
    except (ValueError, TypeError, KeyError) as exc:
        raise DecodeError(f"does not fit the Avro schema ({type(exc).__name__}: {exc})") from exc
    return out.getvalue()


def _jsonable(value):
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, bytes):
        return value.decode("latin-1")  # Avro's JSON encoding of bytes
    return value
