"""The header codec (``recovery.broker.codec``): the types pika cannot carry on its own, and a
decoder that answers as pika's does. Pure logic: no broker, no database."""

import pika
import pika.data
import pika.exceptions
import pytest

from recovery.broker import codec
from recovery.client.headers import LongBytes, RawTimestamp, headers_from_json


def pika_decoded(encoded):
    """What pika 1.4's own table decoder makes of ``encoded`` (ours is installed in its place)."""
    installed = pika.data.decode_value, pika.data.decode_table
    pika.data.decode_value = codec.PIKA_DECODERS["decode_value"]
    pika.data.decode_table = codec.PIKA_DECODERS["decode_table"]
    try:
        return pika.data.decode_table(encoded, 0)
    finally:
        pika.data.decode_value, pika.data.decode_table = installed


class TestHeaderCodecEdgeTypes:
    """The types pika cannot carry on its own survive pika's encoder and decoder (patched)."""

    def round_trip(self, value):
        pieces = []
        pika.data.encode_table(pieces, {"v": value})
        return pika.data.decode_table(b"".join(pieces), 0)[0]["v"]

    def test_a_non_utf8_long_string_stays_a_long_string(self):
        value = self.round_trip(LongBytes(b"caf\xe9"))
        assert type(value) is LongBytes and value == b"caf\xe9"
        assert type(self.round_trip(b"caf\xe9")) is bytes  # a byte array stays one

    def test_a_timestamp_out_of_datetime_range_survives(self):
        value = self.round_trip(RawTimestamp(2**62))
        assert type(value) is RawTimestamp and value == 2**62

    def test_every_field_type_decodes_as_pikas_own_decoder_does(self):
        # Hand-encoded: pika's encoder never writes b, B, U, u, s, i, L. Ours is a rewrite of
        # pika's decoder (speed): every type must come back as pika's does, type included.
        fields = [
            (b"t", b"\x01"),
            (b"b", b"\xfe"),
            (b"B", b"\xfe"),
            (b"U", b"\xff\xfe"),
            (b"u", b"\xff\xfe"),
            (b"s", b"\xff\xfe"),
            (b"I", b"\xff\xff\xff\xfe"),
            (b"i", b"\xff\xff\xff\xfe"),
            (b"l", b"\xff" * 7 + b"\xfe"),
            (b"L", b"\x00" * 7 + b"\x05"),
            (b"D", b"\x02\xff\xff\xff\x85"),
            (b"S", b"\x00\x00\x00\x03ab\x00"),
            (b"x", b"\x00\x00\x00\x02\xff\x00"),
            (b"V", b""),
            (b"T", b"\x00\x00\x00\x00\x69\x20\x3a\x40"),
            (b"A", b"\x00\x00\x00\x07" + b"VS\x00\x00\x00\x01z"),
            (b"F", b"\x00\x00\x00\x03" + b"\x01kV"),
        ]
        entries = (
            b"".join(
                bytes([len(b"k%d" % n)]) + b"k%d" % n + kind + payload
                for n, (kind, payload) in enumerate(fields)
            )
            + b"\x02\xff\xfeV"
        )  # a key that is not UTF-8 stays bytes, as in pika
        encoded = len(entries).to_bytes(4, "big") + entries
        ours = pika.data.decode_table(encoded, 0)
        theirs = pika_decoded(encoded)
        assert ours[1] == theirs[1] == len(encoded)
        assert list(ours[0]) == list(theirs[0])
        for key, value in theirs[0].items():
            assert type(ours[0][key]) is type(value) and ours[0][key] == value, key
        assert type(ours[0]["k8"]).__name__ == "long"  # so pika sends it back as 'l'
        assert ours[0][b"\xff\xfe"] is None
        # From a memoryview too (what a caller slicing a frame without copying would pass).
        assert pika.data.decode_table(memoryview(encoded), 0) == ours

    def test_floats_decode_as_floats_where_pika_truncates(self):
        entries = b"\x01dd" + b"\x3f\xf8" + b"\x00" * 6 + b"\x01ff" + b"\x3f\xc0\x00\x00"
        encoded = len(entries).to_bytes(4, "big") + entries
        assert pika.data.decode_table(encoded, 0)[0] == {"d": 1.5, "f": 1.5}
        assert pika_decoded(encoded)[0] == {"d": 1, "f": 1}

    def test_an_unknown_field_type_is_refused_like_pika_does(self):
        encoded = b"\x00\x00\x00\x03\x01kZ"
        with pytest.raises(pika.exceptions.InvalidFieldTypeException):
            pika.data.decode_table(encoded, 0)

    def test_json_forms_come_back_as_the_same_types(self):
        data = {
            "l": {"$t": "lstr", "v": "Y2Fm6Q=="},
            "t": {"$t": "timestamp", "v": 2**62},
            "z": {"$t": "str0", "v": ["a", "b"]},
        }
        assert headers_from_json(data) == {
            "l": LongBytes(b"caf\xe9"),
            "t": RawTimestamp(2**62),
            "z": "a\x00b",
        }
