"""recovery/telemetry's pure half: OTLP decoding, the messaging spans' rows, their Parquet
store and its compaction. No Django, no server: spans from the real OpenTelemetry SDK, encoded
by the real OTLP exporter's encoder, and the captured OTLP JSON of real instrumented clients
(tests/telemetry/fixtures/)."""

import base64
import gzip
import json
import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import zstandard
from google.protobuf import json_format

from recovery.telemetry import otlp, spans, store
from recovery.telemetry.schema import COLUMN_NAMES, SPAN_SCHEMA
from tests.helpers.telemetry import START, sdk_request

FIXTURES = Path(__file__).parent / "fixtures"
KIND_NUMBERS = {"SPAN_KIND_PRODUCER": 4, "SPAN_KIND_CONSUMER": 5, "SPAN_KIND_SERVER": 2}


def only_rows(flattened):
    assert list(flattened.by_hour) == [("2026-11-30", "00")]
    columns = flattened.by_hour[("2026-11-30", "00")]
    return [
        dict(zip(columns, values, strict=True)) for values in zip(*columns.values(), strict=True)
    ]


def test_the_sdks_protobuf_keeps_the_messaging_spans_with_both_conventions_promoted():
    request, finished = sdk_request()
    decoded = otlp.decode(request.SerializeToString(), otlp.PROTOBUF)
    flattened = spans.flatten(decoded)
    assert (flattened.kept, flattened.skipped, flattened.rejected) == (2, 1, 0)
    producer, consumer = only_rows(flattened)
    ids = [(f"{s.context.trace_id:032x}", f"{s.context.span_id:016x}") for s in finished]
    assert producer == {
        "trace_id": ids[0][0],
        "span_id": ids[0][1],
        "parent_span_id": None,
        "links": [],
        "name": "orders send",
        "kind": "producer",
        "start_ns": START,
        "end_ns": START + 1000,
        "status_code": "unset",
        "status_message": None,
        "service_name": "orders",
        "service_instance": "web-1",
        "scope_name": "opentelemetry.instrumentation.pika",
        "messaging_system": "rabbitmq",
        "operation": "send",
        "destination": "orders",
        "routing_key": "orders.created",
        "message_id": "m-1",
        "consumer_group": None,
        "conversation_id": "c-1",
        "delivery_tag": None,
        "attributes": [
            ("messaging.system", "rabbitmq"),
            ("messaging.destination", "orders"),
            ("messaging.rabbitmq.routing_key", "orders.created"),
            ("messaging.message_id", "m-1"),
            ("messaging.conversation_id", "c-1"),
            ("net.peer.port", "5672"),
        ],
    }
    assert {k: consumer[k] for k in ("kind", "operation", "destination", "routing_key")} == {
        "kind": "consumer",
        "operation": "process",
        "destination": "orders",
        "routing_key": "orders.created",
    }
    assert (consumer["message_id"], consumer["consumer_group"], consumer["delivery_tag"]) == (
        "m-1",
        "billing",
        7,
    )
    assert consumer["messaging_system"] is None  # kept for its kind and messaging.* attributes
    assert ("server.address", "rabbit") in consumer["attributes"]


def test_otlp_json_with_hex_ids_and_snake_case_keys_reads_the_same():
    request, _ = sdk_request()
    from_protobuf = spans.flatten(otlp.decode(request.SerializeToString(), otlp.PROTOBUF))
    document = json_format.MessageToDict(request, preserving_proto_field_name=True)
    for resource_spans in document["resource_spans"]:
        for span in resource_spans["scope_spans"][0]["spans"]:
            for key in ("trace_id", "span_id", "parent_span_id"):
                if key in span:
                    span[key] = base64.b64decode(span[key]).hex()
            span["kind"] = KIND_NUMBERS[span["kind"]]  # OTLP/JSON: enums as integers
    from_json = spans.flatten(otlp.decode(json.dumps(document).encode(), otlp.JSON))
    assert from_json.by_hour == from_protobuf.by_hour


def test_the_captured_amqplib_spans_keep_their_links():
    body = (FIXTURES / "amqplib_publish_consume_links.json").read_bytes()
    flattened = spans.flatten(otlp.decode(body, otlp.JSON))
    assert (flattened.kept, flattened.skipped, flattened.rejected) == (12, 0, 0)
    rows = [
        row for columns in flattened.by_hour.values() for row in zip(*columns.values(), strict=True)
    ]
    index = {name: i for i, name in enumerate(COLUMN_NAMES)}
    consumers = [row for row in rows if row[index["kind"]] == "consumer"]
    assert len(consumers) == 6
    assert all(len(row[index["links"]]) == 1 for row in consumers)
    assert {row[index["operation"]] for row in consumers} == {"process"}


@pytest.mark.parametrize(
    ("body", "media"),
    [
        (b"\xff\xff\xff\xff", otlp.PROTOBUF),
        (b"{not json", otlp.JSON),
        (b"[1, 2]", otlp.JSON),
        (b'{"resourceSpans": {"a": 1}}', otlp.JSON),
        (
            b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"startTimeUnixNano": "x"}]}]}]}',
            otlp.JSON,
        ),
    ],
)
def test_malformed_bodies_are_malformed(body, media):
    with pytest.raises(otlp.Malformed):
        otlp.decode(body, media)


def test_gzip_is_inflated_within_the_limit_and_refused_past_it():
    assert otlp.inflate(gzip.compress(b"x" * 100), "gzip", 100) == b"x" * 100
    with pytest.raises(otlp.TooLarge):
        otlp.inflate(gzip.compress(b"x" * 101), "gzip", 100)
    with pytest.raises(otlp.Malformed):
        otlp.inflate(b"not gzip", "gzip", 100)
    with pytest.raises(otlp.UnsupportedMedia):
        otlp.inflate(b"", "br", 100)
    with pytest.raises(otlp.UnsupportedMedia):
        otlp.media_of("text/plain")
    assert otlp.media_of("application/json; charset=utf-8") == otlp.JSON


def test_a_span_with_a_bad_id_is_rejected_in_partial_success_not_the_batch():
    document = json.loads((FIXTURES / "pika_publish_consume.json").read_bytes())
    document["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["spanId"] = "zz"
    flattened = spans.flatten(otlp.decode(json.dumps(document).encode(), otlp.JSON))
    assert (flattened.kept, flattened.rejected) == (17, 1)
    answer = json.loads(otlp.response(otlp.JSON, flattened.rejected, flattened.error_message))
    assert answer == {
        "partialSuccess": {"rejectedSpans": "1", "errorMessage": "a span with an invalid span_id"}
    }
    assert otlp.response(otlp.PROTOBUF) == b""  # all accepted: partial_success unset


def test_rows_are_written_durably_by_hour_and_read_back(tmp_path):
    request, _ = sdk_request()
    flattened = spans.flatten(request)
    [path] = store.write(str(tmp_path), flattened)
    assert Path(path).parent == tmp_path / "dt=2026-11-30" / "hour=00"
    assert Path(path).name.startswith(f"spans-{store.HOST}-{os.getpid()}-")
    assert [p.name for p in Path(path).parent.iterdir()] == [Path(path).name]  # no temp left
    table = pq.read_table(path)
    assert table.schema.remove_metadata() == SPAN_SCHEMA.remove_metadata()
    assert table.to_pylist() == only_rows(flattened)


def test_a_failed_write_leaves_nothing(tmp_path):
    request, _ = sdk_request()
    flattened = spans.flatten(request)
    # Two hours in one batch: the second hour cannot be written (its directory's name is taken
    # by a file), so the first hour's file, written and fsynced already, must go too.
    other = spans.flatten(request).by_hour[("2026-11-30", "00")]
    flattened.by_hour[("2026-11-30", "01")] = other
    (tmp_path / "dt=2026-11-30").mkdir()
    (tmp_path / "dt=2026-11-30" / "hour=01").write_text("in the way")
    with pytest.raises(OSError):
        store.write(str(tmp_path), flattened)
    assert sorted(p.name for p in (tmp_path / "dt=2026-11-30").rglob("*")) == ["hour=00", "hour=01"]


def test_compaction_swaps_an_hours_files_for_one(tmp_path):
    request, _ = sdk_request()
    for _ in range(3):
        store.write(str(tmp_path), spans.flatten(request))
    hour = tmp_path / "dt=2026-11-30" / "hour=00"
    before = sorted(pq.read_table(hour).to_pylist(), key=str)
    assert store.compact_hour(hour) == (3, 6)
    [merged] = list(hour.iterdir())
    assert merged.name.startswith("spans-")
    assert sorted(pq.read_table(hour).to_pylist(), key=str) == before
    assert [p.name for p in (tmp_path / "dt=2026-11-30").iterdir()] == ["hour=00"]


def test_the_file_exporters_files_are_read_with_bad_records_numbered(tmp_path):
    good = (FIXTURES / "pika_publish_consume.json").read_text()
    lines = tmp_path / "traces.json"
    lines.write_text(json.dumps(json.loads(good)) + "\n{broken\n\n" + json.dumps(json.loads(good)))
    results = list(otlp.read_file(lines, 10**7))
    assert [(n, type(r).__name__) for n, r in results] == [
        (1, "ExportTraceServiceRequest"),
        (2, "Malformed"),
        (4, "ExportTraceServiceRequest"),
    ]
    request, _ = sdk_request()
    compressor = zstandard.ZstdCompressor()
    framed = tmp_path / "traces.zst"
    with open(framed, "wb") as out:
        for payload in (request.SerializeToString(), b"garbage"):
            record = compressor.compress(payload)
            out.write(len(record).to_bytes(4, "big") + record)
    results = list(otlp.read_file(framed, 10**7))
    assert [(n, type(r).__name__) for n, r in results] == [
        (1, "ExportTraceServiceRequest"),
        (2, "Malformed"),
    ]
    assert spans.flatten(results[0][1]).kept == 2
