"""The bare decode-and-write of OTLP trace batches to Parquet: protobuf's parser and pyarrow, no
Lazarus code. The physical limit the span intake (``POST /v1/traces``) is measured against.

For each batch: ``ExportTraceServiceRequest.ParseFromString``, one pass over its spans taking
the columns an audit needs (ids as hex, name, kind, times, status, service, the messaging
attributes as text), one Parquet file written, flushed and fsynced (the intake acknowledges a
batch only once it is durable, so the limit is measured with the same durability).

    .venv/bin/python bench/baselines/otlp_baseline.py BATCH_DIR OUT_DIR

BATCH_DIR holds ``*.pb`` files (one serialized request each); prints spans/s.
"""

import os
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest


def columns_of(request):
    out = {
        k: []
        for k in (
            "trace_id",
            "span_id",
            "parent_span_id",
            "name",
            "kind",
            "start_ns",
            "end_ns",
            "status_code",
            "service_name",
            "attributes",
        )
    }
    for resource_spans in request.resource_spans:
        service = None
        for kv in resource_spans.resource.attributes:
            if kv.key == "service.name":
                service = kv.value.string_value
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                out["trace_id"].append(span.trace_id.hex())
                out["span_id"].append(span.span_id.hex())
                out["parent_span_id"].append(span.parent_span_id.hex() or None)
                out["name"].append(span.name)
                out["kind"].append(span.kind)
                out["start_ns"].append(span.start_time_unix_nano)
                out["end_ns"].append(span.end_time_unix_nano)
                out["status_code"].append(span.status.code)
                out["service_name"].append(service)
                out["attributes"].append(
                    [
                        (kv.key, kv.value.string_value or str(kv.value.int_value))
                        for kv in span.attributes
                        if kv.key.startswith("messaging.")
                    ]
                )
    return out


def decode_and_write(body, path):
    """One batch: parsed, its columns taken, written durably to ``path``; its span count."""
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    table = pa.Table.from_pydict(columns_of(request))
    with open(path, "xb") as handle:
        pq.write_table(table, handle)
        handle.flush()
        os.fsync(handle.fileno())
    return table.num_rows


def run(bodies, out_dir):
    """(spans, seconds) to decode and write every body."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    spans = sum(decode_and_write(body, out_dir / f"b{n}.parquet") for n, body in enumerate(bodies))
    return spans, time.perf_counter() - started


if __name__ == "__main__":
    batch_dir, out = Path(sys.argv[1]), Path(sys.argv[2])
    bodies = [p.read_bytes() for p in sorted(batch_dir.glob("*.pb"))]
    count, seconds = run(bodies, out)
    print(f"{count} spans in {seconds:.2f} s: {count / seconds:,.0f} spans/s")
