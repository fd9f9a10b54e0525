"""POST /v1/traces (#47): the OTLP/HTTP intake, through Django's test client for its answers and
through a live server for real exporters: the OpenTelemetry SDK's Python OTLP exporter (pika,
opentelemetry-instrumentation-pika) and Node's (amqplib, @opentelemetry/instrumentation-amqplib,
which sends chunked bodies), against the real broker. The spans end as Parquet under
AUDIT_SPANS, never in PostgreSQL."""

import gzip
import json
import threading
from pathlib import Path

import pyarrow.dataset as ds
import pytest
from google.protobuf import json_format
from google.rpc import status_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from recovery.access.models import ApiToken
from recovery.telemetry import otlp, store
from tests.helpers import make_user
from tests.helpers.teams import member, team
from tests.helpers.telemetry import sdk_request
from tests.telemetry.services import harness

FIXTURES = Path(__file__).parent / "fixtures"
URL = "/v1/traces"


@pytest.fixture
def spans_dir(settings, tmp_path):
    settings.AUDIT_SPANS = str(tmp_path / "spans")
    return Path(settings.AUDIT_SPANS)


@pytest.fixture
def key(db):
    return ApiToken.issue(make_user("exporter", "operator"), name="otel")[1]


def post(client, body, key=None, content_type=otlp.PROTOBUF, **headers):
    if key is not None:
        headers.setdefault("Authorization", f"Bearer {key}")
    return client.post(URL, data=body, content_type=content_type, headers=headers)


def rows(spans_dir):
    files = sorted(spans_dir.rglob("spans-*.parquet"))
    if not files:
        return []
    return ds.dataset([str(f) for f in files], format="parquet").to_table().to_pylist()


def fixture_request(name="pika_publish_consume"):
    return otlp.from_json_document(json.loads((FIXTURES / f"{name}.json").read_text()))


def test_protobuf_batch_is_durable_before_the_answer(client, key, spans_dir):
    request, finished = sdk_request()
    response = post(client, request.SerializeToString(), key)
    assert response.status_code == 200, response.content
    assert response["Content-Type"] == otlp.PROTOBUF
    answer = ExportTraceServiceResponse.FromString(response.content)
    assert not answer.HasField("partial_success")
    kept = rows(spans_dir)
    # Two messaging spans of three; the HTTP span is dropped, not rejected.
    assert sorted(r["message_id"] for r in kept) == ["m-1", "m-1"]
    assert {r["service_name"] for r in kept} == {"orders"}
    assert not list(spans_dir.rglob(".tmp-*")), "a temporary file left behind"


def test_json_and_gzip_as_the_collector_sends_them(client, key, spans_dir):
    document = json.loads((FIXTURES / "amqplib_publish_consume.json").read_text())
    body = gzip.compress(json.dumps(document).encode())
    response = post(client, body, key, content_type=otlp.JSON, **{"Content-Encoding": "gzip"})
    assert response.status_code == 200, response.content
    assert response["Content-Type"] == otlp.JSON
    assert json.loads(response.content) == {}
    expected = len(list(harness.iter_spans(document)))
    assert len(rows(spans_dir)) == expected > 0


def test_a_token_scheme_too(client, key, spans_dir):
    body = fixture_request().SerializeToString()
    assert post(client, body, Authorization=f"Token {key}").status_code == 200


def test_partial_success_names_the_spans_it_could_not_keep(client, key, spans_dir):
    request = fixture_request()
    bad = request.resource_spans[0].scope_spans[0].spans[0]
    bad.trace_id = bytes(16)
    total = sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)
    response = post(client, request.SerializeToString(), key)
    assert response.status_code == 200
    answer = ExportTraceServiceResponse.FromString(response.content)
    assert answer.partial_success.rejected_spans == 1
    assert "trace_id" in answer.partial_success.error_message
    assert len(rows(spans_dir)) == total - 1


def status_of(response):
    if response["Content-Type"] == otlp.PROTOBUF:
        return status_pb2.Status.FromString(response.content)
    return json_format.Parse(response.content, status_pb2.Status())


@pytest.mark.parametrize(
    "authorization",
    [None, "Bearer", "Basic Z3Vlc3Q6Z3Vlc3Q=", "Bearer lz_not-a-token"],
    ids=["none", "empty", "basic", "unknown"],
)
def test_no_token_no_spans(client, db, spans_dir, authorization):
    headers = {"Authorization": authorization} if authorization else {}
    response = post(client, fixture_request().SerializeToString(), **headers)
    assert response.status_code == 401
    assert status_of(response).code == 16  # UNAUTHENTICATED
    assert rows(spans_dir) == []


def test_a_viewer_token_may_not_write_spans(client, db, spans_dir):
    viewer_key = ApiToken.issue(make_user("vic", "viewer"))[1]
    response = post(client, fixture_request().SerializeToString(), viewer_key)
    assert response.status_code == 403
    assert "operator" in status_of(response).message
    assert rows(spans_dir) == []


def test_a_revoked_token_may_not(client, db, spans_dir):
    token, raw = ApiToken.issue(make_user("rev", "operator"))
    token.revoke()
    assert post(client, fixture_request().SerializeToString(), raw).status_code == 401


def test_a_team_operator_token_may(client, db, spans_dir):
    payments = team("payments", "pay.*")
    user = member("pia", payments)
    raw = ApiToken.issue(user, team=payments)[1]
    assert post(client, fixture_request().SerializeToString(), raw).status_code == 200


@pytest.mark.parametrize(
    ("body", "headers", "status"),
    [
        (b"\x0a\xff\xff", {}, 400),
        (b"not gzip", {"Content-Encoding": "gzip"}, 400),
        (b"x", {"Content-Encoding": "br"}, 415),
    ],
    ids=["bad-protobuf", "bad-gzip", "brotli"],
)
def test_bad_bodies_get_a_status_and_write_nothing(client, key, spans_dir, body, headers, status):
    response = post(client, body, key, **headers)
    assert response.status_code == status
    assert status_of(response).message
    assert rows(spans_dir) == []


def test_bad_json_is_answered_in_json(client, key, spans_dir):
    response = post(client, b'{"resourceSpans": 3}', key, content_type=otlp.JSON)
    assert response.status_code == 400
    assert response["Content-Type"] == otlp.JSON
    assert "resourceSpans" in status_of(response).message


def test_other_media_types_are_415(client, key, spans_dir):
    response = post(client, b"a=b", key, content_type="application/x-www-form-urlencoded")
    assert response.status_code == 415
    assert "application/x-protobuf" in status_of(response).message


def test_get_is_405(client, db):
    assert client.get(URL).status_code == 405


def test_too_large_as_sent_and_as_inflated(client, key, spans_dir, settings):
    body = fixture_request().SerializeToString()
    settings.OTLP_MAX_BODY_BYTES = len(body) - 1
    assert post(client, body, key).status_code == 413
    settings.OTLP_MAX_BODY_BYTES = 1024**2
    settings.OTLP_MAX_INFLATED_BYTES = 1000
    bomb = gzip.compress(b"\0" * 10_000_000)
    response = post(client, bomb, key, **{"Content-Encoding": "gzip"})
    assert response.status_code == 413
    assert rows(spans_dir) == []


def test_full_intake_answers_503_with_retry_after(client, key, spans_dir, settings):
    settings.OTLP_MAX_IN_FLIGHT = 1
    settings.OTLP_RETRY_AFTER_SECONDS = 7
    body = fixture_request().SerializeToString()
    with store.IN_FLIGHT.slot(1):  # another request of this process is writing
        response = post(client, body, key)
    assert response.status_code == 503
    assert response["Retry-After"] == "7"
    assert rows(spans_dir) == []
    assert post(client, body, key).status_code == 200  # and takes it when asked again


def test_short_of_disk_answers_503(client, key, spans_dir, settings):
    settings.OTLP_MIN_FREE_BYTES = 2**62
    response = post(client, fixture_request().SerializeToString(), key)
    assert response.status_code == 503
    assert "disk" in status_of(response).message
    assert response["Retry-After"]


def test_a_failed_write_is_503_and_leaves_nothing(client, key, spans_dir):
    spans_dir.parent.mkdir(parents=True, exist_ok=True)
    spans_dir.write_text("a file where the directory should be")  # mkdir fails (also as root)
    response = post(client, fixture_request().SerializeToString(), key)
    assert response.status_code == 503
    assert "could not be written" in status_of(response).message
    assert response["Retry-After"]
    spans_dir.unlink()
    assert rows(spans_dir) == []


def test_a_batch_of_other_spans_only_writes_no_file(client, key, spans_dir):
    request = ExportTraceServiceRequest()
    span = request.resource_spans.add().scope_spans.add().spans.add()
    span.trace_id, span.span_id, span.name, span.kind = b"\1" * 16, b"\2" * 8, "GET /", 2
    span.start_time_unix_nano = 1_796_000_000_000_000_000
    assert post(client, request.SerializeToString(), key).status_code == 200
    assert rows(spans_dir) == []


# -- real exporters, a live server --------------------------------------------------------------


@pytest.fixture
def live_key(transactional_db):
    return ApiToken.issue(make_user("exporter", "operator"), name="otel")[1]


def run_services(language, vhost, endpoint, key, workdir, count=6):
    """A consumer that rejects every second message and a producer of ``count`` messages, both
    exporting to ``endpoint`` with ``key``; the services' own records."""
    header = f"Authorization=Bearer {key}"
    workdir.mkdir()
    ready, record = workdir / f"{language}.ready", workdir / f"{language}.jsonl"
    common = {"amqp_url": harness.amqp_url(vhost), "otlp_endpoint": endpoint, "record": record}
    consumer = harness.start_service(
        language,
        "consume",
        queue="orders.billing",
        group="billing",
        declare=True,
        reject="every:2",
        idle=1.5,
        expect=count,
        ready_file=ready,
        service_name=f"{language}-billing",
        header=[header],
        **common,
    )
    harness.wait_until(ready.exists, what="the consumer")
    producer = harness.start_service(
        language,
        "produce",
        exchange="orders",
        declare=True,
        count=count,
        id_prefix="m-",
        service_name=f"{language}-orders",
        header=[header],
        **common,
    )
    harness.finish(producer)
    harness.finish(consumer)
    return harness.read_record(record)


@pytest.fixture
def service_vhost(request):
    vhost = f"lazarus-intake-{request.node.name[-40:]}-{threading.get_native_id()}"
    harness.put_vhost(vhost)
    yield vhost
    harness.delete_vhost(vhost)


@pytest.mark.slow
@pytest.mark.parametrize("language", ["python", "node"])
def test_real_exporters_reach_the_store(
    language, live_server, live_key, spans_dir, service_vhost, tmp_path
):
    record = run_services(
        language, service_vhost, live_server.url + URL, live_key, tmp_path / "work"
    )
    kept = rows(spans_dir)
    published = sorted(r["message_id"] for r in kept if r["kind"] == "producer" and r["message_id"])
    assert set(published) == {f"m-{n}" for n in range(1, 7)}
    consumed = [r for r in kept if r["kind"] == "consumer"]
    assert len(consumed) >= 6, f"{len(consumed)} consumer spans: {record}"
    assert {r["service_name"] for r in kept} == {f"{language}-orders", f"{language}-billing"}
    # Nothing of it in PostgreSQL: the spans are files only.
    assert store.span_files(next(spans_dir.glob("dt=*/hour=*")))


def test_a_chunked_body_a_server_already_decoded(rf, key, spans_dir):
    """gunicorn decodes a chunked body and says the stream ends with it
    (``wsgi.input_terminated``): there is no Content-Length to read by."""
    import io

    from recovery.api.traces import export_traces

    body = fixture_request().SerializeToString()
    request = rf.generic(
        "POST", URL, body, content_type=otlp.PROTOBUF, HTTP_AUTHORIZATION=f"Bearer {key}"
    )
    del request.META["CONTENT_LENGTH"]
    request.META["wsgi.input"] = io.BytesIO(body)
    request.META["wsgi.input_terminated"] = True
    request.META["HTTP_TRANSFER_ENCODING"] = "chunked"
    assert export_traces(request).status_code == 200
    assert len(rows(spans_dir)) > 0


def test_import_spans_reads_the_file_exporters_lines(key, spans_dir, tmp_path, capsys):
    from django.core.management import call_command

    document = json.loads((FIXTURES / "pika_publish_consume.json").read_text())
    exported = tmp_path / "traces.jsonl"
    exported.write_text(json.dumps(document) + "\n{not json\n" + json.dumps(document) + "\n")
    with pytest.raises(SystemExit) as exit_:
        call_command("import_spans", str(exported))
    assert exit_.value.code == 1  # one record was unreadable: said, and the others kept
    out, err = capsys.readouterr()
    assert "record 2" in err
    per_document = len(list(harness.iter_spans(document)))
    assert len(rows(spans_dir)) == 2 * per_document
    assert f"{2 * per_document} messaging spans kept" in out


def test_import_spans_compacts_closed_hours(key, spans_dir, tmp_path, capsys):
    from django.core.management import call_command

    document = json.loads((FIXTURES / "pika_publish_consume.json").read_text())
    exported = tmp_path / "traces.jsonl"
    exported.write_text((json.dumps(document) + "\n") * 3)
    call_command("import_spans", str(exported))
    hours = sorted(spans_dir.glob("dt=*/hour=*"))
    before = {h: len(store.span_files(h)) for h in hours}
    assert max(before.values()) == 3
    call_command("import_spans", "--compact")
    assert all(len(store.span_files(h)) == 1 for h in hours)
    assert len(rows(spans_dir)) == 3 * len(list(harness.iter_spans(document)))
