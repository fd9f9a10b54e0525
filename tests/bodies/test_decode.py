"""The decoder chain on real encoder output (gzip, zlib, zstandard, msgpack): pure logic, so no
broker here; tests/bodies/test_readable.py takes bodies through the broker, store and console."""

import base64
import gzip
import json
import zlib

import msgpack
import pytest
import zstandard

from recovery.bodies import decode, needs_decoding

ORDER = {"order_id": "ord-7731", "amount": 12.5, "items": [{"sku": "A-1", "qty": 2}]}
ORDER_JSON = json.dumps(ORDER).encode()


@pytest.mark.parametrize(
    ("encoding", "content_type", "body", "chain"),
    [
        ("gzip", "application/json", gzip.compress(ORDER_JSON, mtime=0), ["gzip", "json"]),
        ("x-gzip", "application/json", gzip.compress(ORDER_JSON, mtime=0), ["gzip", "json"]),
        ("deflate", "application/json", zlib.compress(ORDER_JSON), ["deflate", "json"]),
        ("deflate", "application/json", zlib.compress(ORDER_JSON, wbits=-15), ["deflate", "json"]),
        ("zstd", "application/json", zstandard.compress(ORDER_JSON), ["zstd", "json"]),
        ("base64", "application/json", base64.b64encode(ORDER_JSON), ["base64", "json"]),
        (
            "gzip, base64",  # gzipped first, then base64'd: undone base64 first
            "application/vnd.orders+json",
            base64.b64encode(gzip.compress(ORDER_JSON, mtime=0)),
            ["base64", "gzip", "json"],
        ),
        ("", "application/msgpack", msgpack.packb(ORDER), ["msgpack"]),
        (
            "zstd",
            "application/x-msgpack",
            zstandard.compress(msgpack.packb(ORDER)),
            ["zstd", "msgpack"],
        ),
        ("identity", "", ORDER_JSON, ["json"]),
    ],
)
def test_each_chain_reads_back_the_document(encoding, content_type, body, chain):
    decoded = decode(body, content_type, encoding)
    assert decoded.error is None and not decoded.truncated
    assert decoded.chain == chain and decoded.value == ORDER
    assert '"order_id": "ord-7731"' in decoded.text
    assert "ord-7731" in decoded.search_text(8192)
    assert needs_decoding(content_type, encoding) == (chain != ["json"])


@pytest.mark.parametrize(
    ("content_type", "content_encoding", "chain", "edited"),
    [
        ("application/json", "gzip", ["gzip", "json"], {**ORDER, "amount": 99}),
        ("application/json", "deflate", ["deflate", "json"], {**ORDER, "amount": 99}),
        (
            "application/msgpack",
            "zstd",
            ["zstd", "msgpack"],
            {**ORDER, "blob": {"$base64": "AAEC"}},
        ),
        ("application/json", "gzip, base64", ["base64", "gzip", "json"], {**ORDER, "note": "é"}),
        ("application/msgpack", "", ["msgpack"], [1, "two", None]),
    ],
)
def test_an_edited_document_encodes_back_through_the_same_chain(
    content_type, content_encoding, chain, edited
):
    original = decode(encode_plain(edited, chain), content_type, content_encoding)
    assert original.chain == chain and original.editable
    again = decode(original.encode(edited), content_type, content_encoding)
    assert again.chain == chain and again.value == edited and again.error is None


def encode_plain(value, chain):
    """What a producer sends, written with the libraries themselves (not recovery.bodies)."""
    data = (
        msgpack.packb(value, use_bin_type=True)
        if chain[-1] == "msgpack"
        else json.dumps(value).encode()
    )
    for layer in reversed(chain[:-1]):
        data = {
            "gzip": gzip.compress,
            "deflate": zlib.compress,
            "zstd": zstandard.compress,
            "base64": base64.b64encode,
        }[layer](data)
    return data


def test_msgpack_bytes_are_base64_and_come_back_as_bytes():
    body = msgpack.packb({"raw": b"\x00\x01\x02", 7: "int key"}, use_bin_type=True)
    decoded = decode(body, "application/msgpack")
    assert decoded.value == {"raw": {"$base64": "AAEC"}, "7": "int key"}
    assert msgpack.unpackb(decoded.encode(decoded.value))["raw"] == b"\x00\x01\x02"


@pytest.mark.parametrize(
    ("encoding", "content_type", "body", "error"),
    [
        (
            "gzip",
            "application/json",
            gzip.compress(ORDER_JSON, mtime=0)[:-12],
            "gzip: truncated stream",
        ),
        ("gzip", "application/json", b"not gzip at all", "gzip: corrupt stream"),
        ("zstd", "application/json", zstandard.compress(ORDER_JSON)[:-6], "zstd: truncated"),
        ("zstd", "", b"\x28\xb5\x2f\xfd garbage", "zstd: corrupt stream"),
        ("base64", "", b"%%%not base64", "base64: not base64"),
        ("br", "application/json", b"\x8b\x02\x80", "unknown content_encoding 'br'"),
        ("gzip", "application/json", gzip.compress(b"{not json", mtime=0), "json: not JSON"),
        ("", "application/msgpack", b"\xc1", "msgpack: not MessagePack"),
    ],
)
def test_a_body_that_does_not_decode_says_which_layer_and_why(encoding, content_type, body, error):
    decoded = decode(body, content_type, encoding)
    assert decoded.error and decoded.error.startswith(error), decoded.error
    assert decoded.value is None and not decoded.editable


def test_a_gzip_bomb_is_cut_at_the_limit_and_labelled():
    """1 GiB of zeros in about 1 MiB of gzip: inflated no further than the limit."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(16 * 1024 * 1024)
    bomb = b"".join(compressor.compress(zeros) for _ in range(64)) + compressor.flush()
    assert len(bomb) < 2 * 1024 * 1024
    decoded = decode(bomb, "application/json", "gzip", limit=1024 * 1024)
    assert decoded.truncated and len(decoded.data) == 1024 * 1024
    assert "inflates past 1048576 bytes" in decoded.error and decoded.value is None


def test_a_zstd_bomb_is_cut_at_the_limit():
    compressor = zstandard.ZstdCompressor(level=3)
    bomb = compressor.compress(bytes(256 * 1024 * 1024))
    decoded = decode(bomb, "", "zstd", limit=1024 * 1024)
    assert decoded.truncated and len(decoded.data) == 1024 * 1024 and decoded.chain == ["zstd"]


def test_plain_bodies_are_left_as_they_are():
    assert decode(b"plain text", "text/plain").chain == []
    assert not decode(b"42").applies  # a JSON scalar without a content type is just text
    assert decode(b"\xff\xfe", "application/octet-stream").applies is False
    assert not needs_decoding("application/json", "") and not needs_decoding("", "identity")
