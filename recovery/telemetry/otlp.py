"""OTLP trace requests in and responses out: bytes to an ``ExportTraceServiceRequest``, and the
answer in the request's own encoding. Pure (no Django).

Protobuf (``application/x-protobuf``) and the OTLP/JSON mapping (``application/json``): ids are
hex strings, not protobuf JSON's base64; enums may be integers or names; ``intValue`` may be a
string; keys lowerCamelCase or the proto's snake_case (both are what ``json_format`` accepts);
unknown fields are ignored, as the spec says receivers must. A body that is not such a request
is a ``Malformed`` (the view's 400); a gzip body is inflated first, never past the size limit.
"""

import base64
import gzip
import io
import json
import zlib

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
CONTENT_TYPES = {PROTOBUF: PROTOBUF, "application/protobuf": PROTOBUF, JSON: JSON}


class Malformed(ValueError):
    """The body is not an ExportTraceServiceRequest (400)."""


class TooLarge(ValueError):
    """The body, or what it inflates to, is past the limit (413)."""


class UnsupportedMedia(ValueError):
    """Neither protobuf nor JSON, or an encoding other than gzip/identity (415)."""


def media_of(content_type):
    """The canonical media type of a Content-Type header (parameters ignored), else raise."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media not in CONTENT_TYPES:
        raise UnsupportedMedia(
            f"Content-Type {media or '(none)'!r}: send application/x-protobuf or application/json"
        )
    return CONTENT_TYPES[media]


def inflate(body, content_encoding, limit):
    """The body with its Content-Encoding (gzip, or none) undone, at most ``limit`` bytes."""
    encoding = (content_encoding or "identity").strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding not in ("gzip", "x-gzip"):
        raise UnsupportedMedia(f"Content-Encoding {encoding!r}: only gzip is supported")
    inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
    try:
        out = inflater.decompress(body, limit + 1)
        if len(out) > limit:
            raise TooLarge(f"the body inflates past {limit} bytes")
        if not inflater.eof:
            raise Malformed("gzip: the body ends before the stream does")
    except zlib.error as error:
        raise Malformed(f"gzip: {error}") from None
    return out


def decode(body, media):
    """An ExportTraceServiceRequest from protobuf or OTLP/JSON bytes, else Malformed."""
    if media == PROTOBUF:
        request = ExportTraceServiceRequest()
        try:
            request.ParseFromString(body)
        except (DecodeError, RuntimeError, ValueError) as error:
            raise Malformed(f"protobuf: not an ExportTraceServiceRequest ({error})") from None
        return request
    return decode_json(body)


def decode_json(body):
    try:
        document = json.loads(body)
    except (UnicodeDecodeError, ValueError) as error:
        raise Malformed(f"JSON: {error}") from None
    return from_json_document(document)


def from_json_document(document):
    """An ExportTraceServiceRequest from a parsed OTLP/JSON document (a dict)."""
    if not isinstance(document, dict):
        raise Malformed("JSON: the body must be an object with resourceSpans")
    try:
        _hex_ids_to_base64(document)
        return json_format.ParseDict(
            document, ExportTraceServiceRequest(), ignore_unknown_fields=True
        )
    except (json_format.ParseError, TypeError, AttributeError, ValueError) as error:
        raise Malformed(f"JSON: {_short(str(error))}") from None


ID_KEYS = ("traceId", "trace_id", "spanId", "span_id", "parentSpanId", "parent_span_id")


def _hex_ids_to_base64(document):
    """OTLP/JSON writes ids as hex, protobuf's JSON reads bytes as base64: convert in place. An
    id that is not hex becomes empty (the span is then rejected for its id, not the batch)."""
    for resource_spans in _items(document, "resourceSpans", "resource_spans"):
        for scope_spans in _items(resource_spans, "scopeSpans", "scope_spans"):
            for span in _items(scope_spans, "spans"):
                _convert(span)
                for link in _items(span, "links"):
                    _convert(link)


def _items(parent, *keys):
    if not isinstance(parent, dict):
        raise Malformed("JSON: expected an object")
    for key in keys:
        value = parent.get(key)
        if value is not None:
            if not isinstance(value, list):
                raise Malformed(f"JSON: {key} must be an array")
            return value
    return ()


def _convert(obj):
    if not isinstance(obj, dict):
        raise Malformed("JSON: a span or link must be an object")
    for key in ID_KEYS:
        value = obj.get(key)
        if isinstance(value, str):
            try:
                raw = bytes.fromhex(value)
            except ValueError:
                raw = b""
            obj[key] = base64.b64encode(raw).decode()


def response(media, rejected=0, message=""):
    """The success body: an ExportTraceServiceResponse in the request's encoding, with
    partial_success only when spans were rejected (the spec: leave it unset otherwise)."""
    answer = ExportTraceServiceResponse()
    if rejected:
        answer.partial_success.rejected_spans = rejected
        answer.partial_success.error_message = message
    if media == PROTOBUF:
        return answer.SerializeToString()
    return json_format.MessageToJson(answer, indent=None).encode()


def status(media, code, message):
    """A failure body: google.rpc.Status, as the OTLP/HTTP spec says, in the request's
    encoding (JSON when the request's is unknown)."""
    body = status_pb2.Status(code=code, message=message)
    if media == PROTOBUF:
        return body.SerializeToString()
    return json_format.MessageToJson(body, indent=None).encode()


def _short(text, limit=300):
    return text if len(text) <= limit else text[: limit - 3] + "..."


ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
GZIP_MAGIC = b"\x1f\x8b"


def read_file(path, limit):
    """(record number, ExportTraceServiceRequest or Malformed) for each record of a file the
    Collector's ``file`` exporter wrote: with ``format: json`` and no compression, one OTLP/JSON
    request per line (numbered by line); otherwise (``format: proto``, or ``compression: zstd``)
    each record is a 4-byte big-endian length then that many bytes, each zstd-compressed when
    compression is on, JSON or protobuf (numbered from 1). A whole file gzip-compressed (a
    rotated ``.gz``) is read through. A record past ``limit`` bytes is a Malformed, not read."""
    with open(path, "rb") as raw:
        stream = gzip.GzipFile(fileobj=raw) if raw.peek(2)[:2] == GZIP_MAGIC else raw
        first = stream.peek(1)[:1] if hasattr(stream, "peek") else b""
        if first in (b"{", b" ", b"\n", b"\r", b"\t", b""):
            yield from _json_lines(stream, limit)
        else:
            yield from _framed(stream, limit)


def _json_lines(stream, limit):
    for number, line in enumerate(stream, 1):
        if not line.strip():
            continue
        if len(line) > limit:
            yield number, Malformed(f"line of {len(line)} bytes, past the limit of {limit}")
            continue
        try:
            yield number, decode_json(line)
        except Malformed as error:
            yield number, error


def _framed(stream, limit):
    number = 0
    while True:
        head = stream.read(4)
        if not head:
            return
        number += 1
        if len(head) < 4:
            yield number, Malformed("the file ends inside a record's length")
            return
        size = int.from_bytes(head, "big")
        if size > limit:
            yield number, Malformed(f"a record of {size} bytes, past the limit of {limit}")
            return  # the rest cannot be framed without reading it all
        payload = stream.read(size)
        if len(payload) < size:
            yield number, Malformed("the file ends inside a record")
            return
        try:
            if payload[:4] == ZSTD_MAGIC:
                payload = _unzstd(payload, limit)
            media = JSON if payload.lstrip()[:1] == b"{" else PROTOBUF
            yield number, decode(payload, media)
        except (Malformed, TooLarge) as error:
            yield number, Malformed(str(error))


def _unzstd(payload, limit):
    import zstandard  # only the importer needs it

    try:
        reader = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(payload))
        out = reader.read(limit + 1)
    except zstandard.ZstdError as error:
        raise Malformed(f"zstd: {error}") from None
    if len(out) > limit:
        raise TooLarge(f"a record inflates past {limit} bytes")
    return out
