"""The broker as a witness (#48): RabbitMQ's firehose, turned on and read back.

With tracing on for a vhost, every node CCs to the topic exchange ``amq.rabbitmq.trace`` one
message per publish (routing key ``publish.<exchange>``, headers ``exchange_name``,
``routing_keys``, ``properties``, ``node``, ``vhost``, ``connection``, ``channel``, ``user``,
``routed_queues``) and one per delivery to a consumer or a basic.get (``deliver.<queue>``, the
same headers with ``redelivered`` 0/1 instead of ``routed_queues``); the body is the message's.
``wire --trace on`` turns tracing on (management API ``PUT /api/vhosts/{vhost}`` with
``{"tracing": true}``, every node) and declares ``RECOVERY_TRACE_QUEUE`` bound to it with ``#``;
the tap (``recovery.broker.trace_tap``) writes one record per trace message.

The trace queue: a **stream** (``x-max-age`` / ``x-max-length-bytes`` from settings), so a
capture can be read again, where the broker routes firehose messages into streams. RabbitMQ
3.10 does not: the firehose publishes "at most once, stateless", and 3.10's stream queue drops
such a delivery without a word (measured on 3.10.8: the stream stays empty, a quorum or classic
queue bound beside it gets every message). ``TRACE_QUEUE_TYPE=auto`` therefore declares a
stream on 4.0+ and a **quorum** queue before; only the quorum path is exercised on this project's
3.10 broker. On a quorum queue the tap acks after its files are durable, so a crash redelivers.

What the firehose never says, so the audit must not read its silence as an answer:

- it is **at most once and per node**: a trace message the node could not route (no trace
  queue yet, a queue type that refuses it) is gone, and tracing is node state that a restart
  turns off (``node_restart`` below; the tap turns it on again);
- **dead-letter re-publishes are not traced**: a message a queue dead-letters (reject, TTL,
  overflow, delivery limit) reaches ``recovery.dlx``'s queues with no ``publish`` record;
  only the collector's store and the broker's tally (``recovery/broker/tally.py``) say so.
  Likewise a message that expires or is dropped in a queue leaves no record: that absence,
  routed and never delivered, is what the audit reads as a loss, and only where coverage holds;
- publishes by the broker's own plugins (shovels, federation) are traced only as their
  connections publish, and messages routed through exchange-to-exchange bindings name only the
  exchange the client published to.

A **trace_gap** is a span of time (per vhost; per node where a node is named) in which the
trace records cannot be trusted to be complete; a message whose publish or delivery may fall
in it is *unverified*, never lost and never fine. ``coverage_gaps`` computes them from the
coverage records the tap writes:

- ``uncovered``: time no tap was consuming (between two ``consumed`` spans of any tap
  process, or before the first / after the last one within the asked window);
- ``node_restart``: a node whose start time moved (management API uptime, polled each flush):
  from the last poll that saw it up to the tap turning tracing on again after the restart;
- ``retention_drop`` (streams only): the first offset the tap was given after resuming is
  above the last one it committed + 1: the stream dropped unread data by retention.

The records (``TRACE_SCHEMA``; Parquet under ``AUDIT_TRACE/dt=YYYY-MM-DD/hour=HH/``, the hour
of ``ts_ms``) and the coverage records (``COVERAGE_SCHEMA``, under ``AUDIT_TRACE/coverage/``)
are documented field by field in docs/audit.md "The broker as a witness". Duplicates after a
crash are possible (files written, offset not yet committed): ``key`` is stable across
replays (node + stream offset on a stream; a digest of the trace message on a quorum queue,
which two byte-identical trace messages share) — a reader drops duplicate keys.
"""

import datetime
import hashlib
import os
import time
from pathlib import Path

from django.conf import settings

from recovery.broker.connection import connect
from recovery.broker.management import Management
from recovery.broker.topology import broker_version

TRACE_EXCHANGE = "amq.rabbitmq.trace"
FIRST_VERSION_STREAM_TRACE = (4, 0)
COVERAGE_DIR = "coverage"
OFFSETS_DIR = "_offsets"


def trace_queue_type(version=None, setting=None):
    setting = setting or settings.TRACE_QUEUE_TYPE
    if setting in ("stream", "quorum"):
        return setting
    return "stream" if version is not None and version >= FIRST_VERSION_STREAM_TRACE else "quorum"


def trace_queue_arguments(queue_type):
    if queue_type == "stream":
        return {
            "x-queue-type": "stream",
            "x-max-age": settings.TRACE_MAX_AGE,
            "x-max-length-bytes": settings.TRACE_MAX_LENGTH_BYTES,
        }
    return {"x-queue-type": "quorum"}


def node_managements(management=None):
    """{node name: a Management reaching that node's own API}. Tracing is node state, and the
    management API turns it on or off, and reports it, for the node that answers only
    (measured on a 3.10.8 cluster: a PUT through node 1 left nodes 2 and 3 off). The configured
    API serves its own node; every other node's is its ``http``/``https`` listener (the overview
    lists each node's), at the listener's address, or the node name's host where it listens on
    every address, with the same credentials."""
    management = management or Management()
    overview = management.request("GET", "/overview") or {}
    here = overview.get("node")
    nodes = {here: management} if here else {}
    for listener in overview.get("listeners") or []:
        node, protocol = listener.get("node"), listener.get("protocol")
        if node in nodes or protocol not in ("http", "https"):
            continue
        host = listener.get("ip_address") or ""
        if host in ("", "::", "0.0.0.0"):  # noqa: S104 - a listener's address, not a bind
            host = node.partition("@")[2]
        if ":" in host:
            host = f"[{host}]"
        nodes[node] = management.at(protocol, host, listener["port"])
    return nodes


def cluster_nodes(management=None):
    """(every node's name, ``node_managements``)."""
    management = management or Management()
    names = [n["name"] for n in management.request("GET", "/nodes?columns=name") or []]
    return names, node_managements(management)


def set_tracing(vhost, on, management=None):
    """Tracing on/off for ``vhost`` on every node (each node's management API); returns
    ``tracing_on`` read back."""
    management = management or Management()
    current = management.request("GET", f"/vhosts/{management.quote(vhost)}") or {}
    body = {"tracing": bool(on)}
    # PUT replaces the vhost's description and tags: keep them.
    for field in ("description", "tags", "default_queue_type"):
        if current.get(field) not in (None, "", []):
            value = current[field]
            body[field] = ",".join(value) if field == "tags" and isinstance(value, list) else value
    for node_api in node_managements(management).values():
        node_api.request("PUT", f"/vhosts/{management.quote(vhost)}", body)
    return tracing_on(vhost, management)


def tracing_by_node(vhost, management=None, nodes=None):
    """{node: True | False | None (its API did not answer, or it lists none yet)} for
    ``vhost``, every node of the cluster. ``nodes``: ``cluster_nodes``' answer, for a caller
    asking of several vhosts."""
    management = management or Management()
    names, apis = nodes or cluster_nodes(management)
    out = {name: None for name in names if name not in apis}
    for node, node_api in apis.items():
        try:
            out[node] = bool(
                (node_api.request("GET", f"/vhosts/{node_api.quote(vhost)}") or {}).get("tracing")
            )
        except Exception:  # noqa: BLE001 - unknown, never "off"
            out[node] = None
    return out


def tracing_on(vhost, management=None):
    """Whether every node traces ``vhost`` (a node that did not answer is not known to)."""
    by_node = tracing_by_node(vhost, management)
    return bool(by_node) and all(by_node.values())


def wire_trace(vhost, on, management=None):
    """``wire --trace on|off`` for one vhost: idempotent. ``on`` declares the trace queue and its
    binding first (so no trace message finds no queue), then turns tracing on; ``off`` turns
    tracing off and leaves the queue and what it holds (the tap drains it; delete it by hand)."""
    management = management or Management()
    name = settings.RECOVERY_TRACE_QUEUE
    report = {"vhost": vhost, "queue": name}
    if on:
        queue_type = trace_queue_type(broker_version(management))
        conn = connect(vhost)
        try:
            channel = conn.channel()
            channel.queue_declare(name, durable=True, arguments=trace_queue_arguments(queue_type))
            channel.queue_bind(name, TRACE_EXCHANGE, "#")
        finally:
            conn.close()
        report["queue_type"] = queue_type
    report["tracing"] = set_tracing(vhost, on, management)
    return report


def trace_status(vhosts=None, management=None):
    """Per vhost: tracing on, off or None (the nodes differ, or one did not answer) and
    ``by_node``, the trace queue (type, messages, bytes)."""
    management = management or Management()
    rows = []
    try:
        cluster = cluster_nodes(management)
        nodes, unreachable = cluster[0], ""
    except Exception as exc:  # noqa: BLE001 - every row says unknown, never "off"
        nodes, unreachable = [], str(exc)[:200] or type(exc).__name__
    for vhost in vhosts or settings.RECOVERY_VHOSTS:
        row = {"vhost": vhost, "nodes": nodes, "tracing": None, "queue": None, "error": ""}
        if unreachable:
            row["error"] = unreachable
            row["tap"] = tap_state(vhost)
            rows.append(row)
            continue
        try:
            row["by_node"] = tracing_by_node(vhost, management, cluster)
            said = set(row["by_node"].values())
            # on or off only when every node says the same; else None (the page lists them)
            row["tracing"] = said.pop() if len(said) == 1 and None not in said else None
            q = management.request(
                "GET",
                f"/queues/{management.quote(vhost)}/{management.quote(settings.RECOVERY_TRACE_QUEUE)}",
            )
            row["queue"] = {
                "type": q.get("type"),
                "messages": q.get("messages"),
                "bytes": q.get("message_bytes", q.get("segments")),
            }
        except Exception as exc:  # noqa: BLE001 - shown on the page, never a quiet "off"
            if "HTTP 404" not in str(exc):
                row["error"] = str(exc)[:200]
        row["tap"] = tap_state(vhost)
        rows.append(row)
    return rows


# ---- records -----------------------------------------------------------------------------------


def _text(value):
    if value is None:
        return None
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def body_sha(body):
    """A message's identity where it has no ``message_id`` (spark/trace_facts.py): its
    publish and its deliveries carry the same body."""
    return hashlib.sha256(body or b"").hexdigest()[:32]


def trace_record(
    routing_key, headers, body_size, received_ms, stream_offset=None, digest=None, sha=None
):
    """One firehose message as a record of ``TRACE_SCHEMA`` (pure); ``sha``: ``body_sha``."""
    headers = headers or {}
    kind, _, name = routing_key.partition(".")
    properties = headers.get("properties") or {}
    node = _text(headers.get("node")) or ""
    published = properties.get("timestamp")
    is_publish = kind == "publish"
    key = f"{node}:{stream_offset}" if stream_offset is not None else digest
    return {
        "key": key,
        "kind": kind,
        "ts_ms": int(received_ms),
        "client_ts_ms": int(published) * 1000 if isinstance(published, int) else None,
        "node": node,
        "vhost": _text(headers.get("vhost")) or "",
        "exchange": _text(headers.get("exchange_name")) or "",
        "routing_keys": [_text(k) for k in headers.get("routing_keys") or []],
        "routed_queues": [_text(q) for q in headers.get("routed_queues") or []]
        if is_publish
        else None,
        "queue": None if is_publish else name,
        "redelivered": None if is_publish else bool(headers.get("redelivered")),
        "message_id": _text(properties.get("message_id")),
        "connection": _text(headers.get("connection")),
        "channel": headers.get("channel"),
        "user": _text(headers.get("user")),
        "body_size": int(body_size),
        "stream_offset": stream_offset,
        "body_sha": sha,
    }


def message_digest(routing_key, headers, body):
    """The key of a record read from a quorum queue: the same trace message, the same key."""
    h = hashlib.sha256(routing_key.encode())
    h.update(repr(sorted((headers or {}).items())).encode())
    h.update(body or b"")
    return h.hexdigest()[:32]


def _schemas():
    import pyarrow as pa

    trace = pa.schema(
        [
            ("key", pa.string()),
            ("kind", pa.string()),
            ("ts_ms", pa.int64()),
            ("client_ts_ms", pa.int64()),
            ("node", pa.string()),
            ("vhost", pa.string()),
            ("exchange", pa.string()),
            ("routing_keys", pa.list_(pa.string())),
            ("routed_queues", pa.list_(pa.string())),
            ("queue", pa.string()),
            ("redelivered", pa.bool_()),
            ("message_id", pa.string()),
            ("connection", pa.string()),
            ("channel", pa.int32()),
            ("user", pa.string()),
            ("body_size", pa.int64()),
            ("stream_offset", pa.int64()),
            ("body_sha", pa.string()),
        ]
    )
    coverage = pa.schema(
        [
            ("tap", pa.string()),
            ("kind", pa.string()),  # consumed | node_restart | retention_drop
            ("vhost", pa.string()),
            ("node", pa.string()),
            ("from_ms", pa.int64()),
            ("until_ms", pa.int64()),
            ("first_offset", pa.int64()),
            ("last_offset", pa.int64()),
            ("records", pa.int64()),
        ]
    )
    return trace, coverage


def trace_schema():
    return _schemas()[0]


def coverage_schema():
    return _schemas()[1]


# ---- durable files -----------------------------------------------------------------------------


def root(path=None):
    return Path(path or settings.AUDIT_TRACE)


def partition(base, ts_ms):
    at = datetime.datetime.fromtimestamp(ts_ms / 1000, datetime.UTC)
    return Path(base) / f"dt={at:%Y-%m-%d}" / f"hour={at:%H}"


def _fsync_dir(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durably(path, write):
    """``write(tmp_path)``, fsync, rename to ``path``, fsync the directory."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    write(tmp)
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def write_table(path, rows, schema):
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist(rows, schema=schema)
    write_durably(path, lambda tmp: pq.write_table(table, tmp))


def _offset_path(vhost, base=None):
    safe = vhost.replace("/", "%2F") or "%2F"
    return root(base) / OFFSETS_DIR / f"{safe}.json"


def tap_state(vhost, base=None):
    """The tap's committed state for ``vhost``: last offset, last record and flush times."""
    import json

    try:
        return json.loads(_offset_path(vhost, base).read_text())
    except (OSError, ValueError):
        return None


def commit_state(vhost, state, base=None):
    import json

    data = json.dumps(state).encode()

    def write(tmp):
        with open(tmp, "wb") as f:
            f.write(data)

    write_durably(_offset_path(vhost, base), write)


# ---- reading -----------------------------------------------------------------------------------


def read_records(base=None, kind=None):
    """Every trace record under ``base`` (tests, small days), duplicates dropped by key."""
    import pyarrow.parquet as pq

    rows, seen = [], set()
    for path in sorted(root(base).glob("dt=*/hour=*/*.parquet")):
        for row in pq.read_table(path, schema=trace_schema()).to_pylist():
            if row["key"] in seen or (kind and row["kind"] != kind):
                continue
            seen.add(row["key"])
            rows.append(row)
    return rows


def read_coverage(base=None):
    import pyarrow.parquet as pq

    rows = []
    for path in sorted((root(base) / COVERAGE_DIR).glob("dt=*/hour=*/*.parquet")):
        rows.extend(pq.read_table(path, schema=coverage_schema()).to_pylist())
    return rows


def coverage_gaps(vhost, from_ms, until_ms, base=None, slack_ms=None):
    """The trace_gaps of ``vhost`` in [from_ms, until_ms): dicts of kind, node, from_ms,
    until_ms. Consumed spans of one tap that follow each other within ``slack_ms`` (default two
    flush periods) are continuous."""
    if slack_ms is None:
        slack_ms = int(settings.TRACE_FLUSH_SECONDS * 2000)
    rows = [r for r in read_coverage(base) if r["vhost"] == vhost]
    spans = sorted((r["from_ms"], r["until_ms"]) for r in rows if r["kind"] == "consumed")
    gaps = []
    cursor = from_ms
    for start, end in spans:
        if end <= cursor:
            continue
        if start > cursor + slack_ms and start > from_ms:
            gaps.append(
                {
                    "kind": "uncovered",
                    "node": None,
                    "from_ms": cursor,
                    "until_ms": min(start, until_ms),
                }
            )
        cursor = max(cursor, end)
        if cursor >= until_ms:
            break
    if cursor + slack_ms < until_ms:
        gaps.append({"kind": "uncovered", "node": None, "from_ms": cursor, "until_ms": until_ms})
    for r in rows:
        if r["kind"] != "consumed" and r["until_ms"] > from_ms and r["from_ms"] < until_ms:
            gaps.append(
                {
                    "kind": r["kind"],
                    "node": r["node"],
                    "from_ms": r["from_ms"],
                    "until_ms": r["until_ms"],
                }
            )
    return [g for g in gaps if g["until_ms"] > g["from_ms"]]


def now_ms():
    return int(time.time() * 1000)
