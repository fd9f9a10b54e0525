"""Real schemas for the body tests: a .proto compiled by protoc (grpcio-tools) into a
FileDescriptorSet and message classes, an Avro schema, and a local schema registry."""

import http.server
import json
import subprocess
import sys
import threading

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

PROTO = """
syntax = "proto3";
package orders.v1;
message OrderCreated {
  string order_id = 1;
  double amount = 2;
  repeated string skus = 3;
  Customer customer = 4;
}
message Customer { string name = 1; string email = 2; }
message Refund { int64 refund_cents = 7; bool partial = 8; }
"""


AVRO_SCHEMA = {
    "type": "record",
    "name": "Payment",
    "namespace": "payments.v2",
    "fields": [
        {"name": "payment_id", "type": "string"},
        {"name": "cents", "type": "long"},
        {
            "name": "currency",
            "type": {"type": "enum", "name": "Currency", "symbols": ["EUR", "USD"]},
        },
        {"name": "note", "type": ["null", "string"], "default": None},
    ],
}


def compile_orders_proto(folder):
    """(descriptor set bytes, {type name: message class}) from protoc itself, in ``folder``."""
    (folder / "orders.proto").write_text(PROTO)
    out = folder / "orders.desc"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{folder}",
            f"--descriptor_set_out={out}",
            "--include_imports",
            str(folder / "orders.proto"),
        ],
        check=True,
    )
    data = out.read_bytes()
    pool = descriptor_pool.DescriptorPool()
    for file in descriptor_pb2.FileDescriptorSet.FromString(data).file:
        pool.Add(file)
    classes = {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"orders.v1.{name}"))
        for name in ("OrderCreated", "Refund")
    }
    return data, classes


class Registry:
    """A local server answering the Confluent schema registry's documented
    ``GET /schemas/ids/{id}`` ({"schema": "<schema JSON as a string>"}), 404 for other ids;
    no registry installs from the registries this machine reaches, so this stands in for one."""

    def __init__(self, schemas):
        registry = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                registry.requests.append(self.path)
                prefix = "/schemas/ids/"
                schema = None
                if self.path.startswith(prefix) and self.path[len(prefix) :].isdigit():
                    schema = schemas.get(int(self.path[len(prefix) :]))
                if schema is None:
                    self.send_response(404)
                    self.end_headers()
                    self.wfile.write(b'{"error_code": 40403, "message": "Schema not found"}')
                    return
                body = json.dumps({"schema": json.dumps(schema)}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.requests = []
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()
