"""The decoder chain: a stored body's bytes to what an operator can read, and back.

A chain is read from the message's own properties:

- ``content_encoding`` names the byte layers, outermost last, as HTTP's Content-Encoding does
  ("gzip", "base64, gzip" = gzipped, then base64'd): gzip (x-gzip), deflate (zlib or raw),
  zstd, base64; identity and "" are none. An unknown token stops the chain with its name.
- ``content_type`` names the document: JSON (application/json, any ``+json``), MessagePack
  (application/msgpack, x-msgpack, vnd.msgpack) or text (``text/*``).
  A body without a content type that parses as JSON is shown as JSON too.

Nothing here trusts the sender. Every byte layer inflates into at most ``limit`` bytes (a
decompression bomb is cut and labelled ``truncated``, never inflated into memory), a truncated
or corrupt stream is an ``error`` naming the layer, and the raw bytes stay one click away in
the console whatever happens. The stored bytes never change; a replay sends them as stored.
"""

import abc
import base64
import binascii
import dataclasses
import gzip
import io
import json
import zlib

import msgpack
import zstandard

# How much a byte layer may inflate to, by default (BODY_DECODE_LIMIT in settings).
DEFAULT_LIMIT = 16 * 1024 * 1024
CHUNK = 64 * 1024

JSON_TYPES = {"application/json", "text/json"}
MSGPACK_TYPES = {"application/msgpack", "application/x-msgpack", "application/vnd.msgpack"}
ENCODING_ALIASES = {"x-gzip": "gzip", "zstandard": "zstd"}
IDENTITY = {"", "identity"}


class DecodeError(Exception):
    """A layer could not be undone; the message names the layer."""


@dataclasses.dataclass
class Decoded:
    """What the chain made of a body.

    ``chain`` lists the steps that succeeded, outermost first ("gzip", "json"). ``value`` is
    the document when the last step maps to JSON (JSON, MessagePack), ``text`` its readable form
    (pretty JSON, or the text), ``error`` why the chain stopped early, ``truncated`` whether a
    layer was cut at the limit (then ``value`` is None: a cut document cannot be parsed).
    """

    chain: list[str]
    data: bytes
    layers: list[str] = dataclasses.field(default_factory=list)
    document: "Document | None" = None
    value: object = None
    text: str | None = None
    error: str | None = None
    truncated: bool = False

    @property
    def label(self):
        return " → ".join(self.chain)

    @property
    def applies(self):
        """Whether there is anything beyond the raw bytes to show."""
        return bool(self.chain) or self.error is not None

    @property
    def editable(self):
        """Whether an edited rendering can be encoded back through the same chain."""
        return self.error is None and not self.truncated and self.value is not None

    def encode(self, value):
        """The bytes for an edited ``value`` through the same chain (the document's encoder,
        then each byte layer again); DecodeError names what does not fit."""
        if not self.editable or self.document is None:
            raise DecodeError("this body was not decoded into a document: edit it raw")
        data = self.document.serialize(value)
        for layer in self.layers:
            data = ENCODERS[layer](data)
        return data

    def search_text(self, limit):
        """The first ``limit`` characters a search should see (compact JSON, or the text)."""
        if self.value is not None:
            return json.dumps(self.value, ensure_ascii=False, default=str)[:limit]
        if self.text is not None:
            return self.text[:limit]
        return self.data[:limit].decode("utf-8", "replace")


def encodings(content_encoding):
    """The byte layers named by a content_encoding, outermost last; [] for none."""
    tokens = [t.strip().lower() for t in (content_encoding or "").split(",")]
    return [ENCODING_ALIASES.get(t, t) for t in tokens if t not in IDENTITY]


def document_kind(content_type):
    media = (content_type or "").split(";")[0].strip().lower()
    if media in JSON_TYPES or media.endswith("+json"):
        return "json"
    if media in MSGPACK_TYPES:
        return "msgpack"
    if media.startswith("text/"):
        return "text"
    return None


def needs_decoding(content_type, content_encoding):
    """Whether the stored bytes are not already what a reader (and a search) should see."""
    return bool(encodings(content_encoding)) or document_kind(content_type) == "msgpack"


def decode(
    body,
    content_type="",
    content_encoding="",
    limit=DEFAULT_LIMIT,
    partial=False,
    document=None,
    layers=None,
):
    """Undo the chain the properties name; never raises for what a sender put in the body.

    ``document`` (a Document) and ``layers`` come from an admin's decoder rule: the rule's
    document wins over the content type; its layers apply when the message names none.
    ``partial``: a stream that ends early yields what precedes the cut, marked ``truncated``
    (the search index reads only a body's first bytes), instead of an error."""
    result = Decoded(chain=[], data=bytes(body))
    for layer in reversed(encodings(content_encoding) or list(layers or ())):
        step = BYTE_LAYERS.get(layer)
        if step is None:
            result.error = f"unknown content_encoding {layer!r}: shown as stored"
            return result
        try:
            result.data, cut = step(result.data, limit, partial)
        except DecodeError as exc:
            result.error = f"{layer}: {exc}"
            return result
        result.chain.append(layer)
        result.layers.insert(0, layer)
        if cut:
            result.truncated = True
            result.error = (
                f"{layer}: inflates past {limit} bytes; cut there (not parsed)"
                if len(result.data) >= limit
                else f"{layer}: the stream ends early; what precedes the cut is shown"
            )
            result.text = result.data.decode("utf-8", "replace")
            return result
    kind = document_kind(content_type)
    if document is not None:
        _document(result, document)
    elif kind == "msgpack":
        _document(result, MSGPACK)
    elif kind == "json" or kind is None:
        _document(result, JSON, quiet=kind is None)
    if result.text is None and result.chain:
        try:
            result.text = result.data.decode("utf-8")
        except UnicodeDecodeError:
            result.text = None  # binary after the byte layers: the console shows hex
    return result


def _document(result, document, quiet=False):
    try:
        value = document.parse(result.data)
    except DecodeError as exc:
        if not quiet:
            result.error = f"{document.label}: {exc}"
        return
    if quiet and not isinstance(value, dict | list):
        return  # "42" or "true" without a content type is text, not a JSON document
    result.chain.append(document.label)
    result.document = document
    result.value = value
    result.text = json.dumps(value, indent=2, ensure_ascii=False, default=_jsonable)


class Document(abc.ABC):
    """What the innermost bytes are: parsed into a JSON-able value, and serialized back."""

    label = "document"

    @abc.abstractmethod
    def parse(self, data):
        """The JSON-able value of ``data``; DecodeError naming why not."""

    @abc.abstractmethod
    def serialize(self, value):
        """The bytes for ``value``; DecodeError naming the field that does not fit."""


class JsonDocument(Document):
    label = "json"

    def parse(self, data):
        return _json(data)

    def serialize(self, value):
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


class MsgpackDocument(Document):
    label = "msgpack"

    def parse(self, data):
        return _unpack(data)

    def serialize(self, value):
        return msgpack.packb(_from_plain(value), use_bin_type=True)


JSON = JsonDocument()
MSGPACK = MsgpackDocument()


def _json(data):
    # From the bytes: json.loads reads past a byte-order mark (UTF-8, as .NET writes it) and
    # reads UTF-16/32 by RFC 4627's null bytes, as the masking engine does (recovery.masking).
    try:
        return json.loads(bytes(data))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise DecodeError(f"not JSON ({exc})") from exc


def _unpack(data):
    try:
        return _plain(msgpack.unpackb(data, raw=False, strict_map_key=False))
    except (ValueError, msgpack.UnpackException, TypeError, RecursionError) as exc:
        raise DecodeError(f"not MessagePack ({type(exc).__name__}: {exc})") from exc


def _plain(value):
    """MessagePack's values as JSON's: bytes as base64 text, maps with text keys."""
    if isinstance(value, dict):
        return {_key(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, bytes):
        return {"$base64": base64.b64encode(value).decode("ascii")}
    if isinstance(value, msgpack.ExtType):
        return {"$ext": value.code, "$base64": base64.b64encode(value.data).decode("ascii")}
    return value


def _key(key):
    return key if isinstance(key, str) else json.dumps(_plain(key), default=str)


def _jsonable(value):
    return str(value)


def _inflate(data, limit, wbits, partial):
    inflater = zlib.decompressobj(wbits)
    try:
        out = inflater.decompress(data, limit + 1)
    except zlib.error as exc:
        raise DecodeError(f"corrupt stream ({exc})") from exc
    if len(out) > limit:
        return out[:limit], True
    if not inflater.eof:
        if partial:
            return out, True
        raise DecodeError("truncated stream (it ends before its last block)")
    return out, False


def _gzip(data, limit, partial):
    return _inflate(data, limit, 16 + zlib.MAX_WBITS, partial)


def _deflate(data, limit, partial):
    """HTTP's deflate is zlib-wrapped; some senders send raw deflate: both are read."""
    try:
        return _inflate(data, limit, zlib.MAX_WBITS, partial)
    except DecodeError:
        return _inflate(data, limit, -zlib.MAX_WBITS, partial)


def _zstd(data, limit, partial):
    reader = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data))
    out = bytearray()
    try:
        while len(out) <= limit:
            chunk = reader.read(CHUNK)
            if not chunk:
                break
            out += chunk
    except zstandard.ZstdError as exc:
        raise DecodeError(f"corrupt stream ({exc})") from exc
    if len(out) > limit or partial:
        return bytes(out[:limit]), len(out) > limit
    # Under the limit, so checking the frame is complete costs no more memory than the above.
    whole = zstandard.ZstdDecompressor().decompressobj()
    try:
        whole.decompress(data)
    except zstandard.ZstdError as exc:
        raise DecodeError(f"corrupt stream ({exc})") from exc
    if not whole.eof:
        raise DecodeError("truncated stream (the frame is incomplete)")
    return bytes(out), False


def _base64(data, limit, partial):
    try:
        out = base64.b64decode(b"".join(data.split()), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise DecodeError(f"not base64 ({exc})") from exc
    return out, False  # base64 only shrinks


BYTE_LAYERS = {"gzip": _gzip, "deflate": _deflate, "zstd": _zstd, "base64": _base64}


# Encoding back (edit-and-replay on the decoded form): Decoded.encode.


def _from_plain(value):
    if isinstance(value, dict):
        if set(value) == {"$base64"}:
            return base64.b64decode(value["$base64"])
        if set(value) == {"$ext", "$base64"}:
            return msgpack.ExtType(value["$ext"], base64.b64decode(value["$base64"]))
        return {k: _from_plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_from_plain(v) for v in value]
    return value


ENCODERS = {
    "gzip": lambda data: gzip.compress(data, mtime=0),
    "deflate": zlib.compress,
    "zstd": lambda data: zstandard.ZstdCompressor().compress(data),
    "base64": base64.b64encode,
}
