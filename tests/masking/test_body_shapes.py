"""JSON-path masks on every body shape and every display path (#46 items 5, 6, 9, 17): a body that
is not one UTF-8 document json.loads accepts (a BOM, a repeated key, NDJSON, Latin-1, UTF-16),
and bodies behind the decoder chain (base64, protobuf, Avro), never show what a path hides: on
the detail page, the API, the download, an export, /groups/ and a group's page. What cannot be
read as JSON is withheld, saying why."""

import base64
import binascii
import html
import io
import json

import fastavro
import pytest

from recovery.models import (
    Activity,
    AlertRule,
    DecoderRule,
    MaskRule,
    MessageHistory,
    set_privileges,
)
from tests.helpers import make_message, make_user
from tests.helpers.bodies import AVRO_SCHEMA, compile_orders_proto

pytestmark = pytest.mark.django_db

CARD = "4111111111111111"
EMAIL = "carol.secret@corp.example"
NOTE = "pin 8812 for carol"
CARD_DOC = json.dumps({"card": {"number": CARD}})
WITHHELD_JSON = "[withheld: a JSON-path masking rule applies here"


@pytest.fixture(scope="module")
def proto(tmp_path_factory):
    return compile_orders_proto(tmp_path_factory.mktemp("proto"))


def _json(document, **dumps):
    return json.dumps(document, **dumps)


def _avro(value):
    out = io.BytesIO()
    fastavro.schemaless_writer(out, fastavro.parse_schema(AVRO_SCHEMA), value)
    return out.getvalue()


def shape(name, proto):
    """(message fields, the secret the rules hide) for one body shape."""
    card = {"card": {"number": CARD}, "note": "kept"}
    json_type = {"content_type": "application/json"}
    if name == "bom":
        return {"body": b"\xef\xbb\xbf" + _json(card).encode(), **json_type}, CARD
    if name == "duplicate_key":
        body = '{"card": {"number": "CARD"}, "note": "kept", "card": "x"}'.replace("CARD", CARD)
        return {"body": body.encode(), **json_type}, CARD
    if name == "ndjson":
        body = _json({"n": 1}) + "\n" + _json(card) + "\n"
        return {"body": body.encode(), "content_type": "application/x-ndjson"}, CARD
    if name == "latin1":
        body = _json({"name": "Müller", **card}, ensure_ascii=False).encode("latin-1")
        return {"body": body, "content_type": "application/json; charset=iso-8859-1"}, CARD
    if name == "utf16":
        body = _json(card).encode("utf-16")
        return {"body": body, "content_type": "application/json; charset=utf-16"}, CARD
    if name == "base64":
        body = base64.b64encode(_json(card).encode())
        return {"body": body, "content_encoding": "base64", **json_type}, CARD
    if name == "protobuf":
        descriptor_set, classes = proto
        DecoderRule.objects.create(
            name="orders",
            queue_pattern="shapes.protobuf",
            decoder="protobuf",
            descriptor_set=descriptor_set,
            protobuf_type="orders.v1.OrderCreated",
        )
        order = classes["OrderCreated"](order_id="o-1", customer={"name": "C", "email": EMAIL})
        return {"body": order.SerializeToString(), "content_type": ""}, EMAIL
    assert name == "avro"
    DecoderRule.objects.create(
        name="payments",
        queue_pattern="shapes.avro",
        decoder="avro",
        avro_schema=json.dumps(AVRO_SCHEMA),
    )
    payment = {"payment_id": "p-1", "cents": 5, "currency": "EUR", "note": NOTE}
    return {"body": _avro(payment), "content_type": ""}, NOTE


SHAPES = ["bom", "duplicate_key", "ndjson", "latin1", "utf16", "base64", "protobuf", "avro"]
PATHS = ["detail", "api_detail", "download", "export", "groups", "group_page"]


def readings(data):
    """Every way a reader could read shown bytes: as they are (Latin-1, UTF-16 either way),
    and base64-decoded once."""
    texts = [data.decode("latin-1")]
    for encoding in ("utf-16-le", "utf-16-be"):
        texts.append(data.decode(encoding, "ignore"))
        texts.append(data[1:].decode(encoding, "ignore"))
    try:
        inner = base64.b64decode(b"".join(data.split()), validate=True)
    except (binascii.Error, ValueError):
        inner = None
    if inner:
        texts += readings(inner)
    return texts


def assert_hidden(secret, data):
    if isinstance(data, str):
        data = data.encode()
    for text in readings(data):
        assert secret not in text
    # The hex view's bytes, however the body is encoded
    for encoding in ("utf-8", "utf-16-le", "utf-16-be"):
        assert secret.encode(encoding).hex(" ")[:23] not in data.decode("latin-1")


@pytest.fixture
def path_rules():
    for pattern in ("$.card.number", "$.customer.email", "$.note"):
        MaskRule.objects.create(kind="json_path", pattern=pattern)


def shown_on(path, client, api, message):
    """What ``path`` shows of ``message`` to the logged-in exporter (bytes)."""
    if path == "detail":
        return client.get(f"/messages/{message.pk}/").content
    if path == "api_detail":
        data = api.get(f"/api/v1/messages/{message.pk}").json()
        return json.dumps(data).encode() + b"\n" + base64.b64decode(data["body_base64"])
    if path == "download":
        response = client.get(f"/messages/{message.pk}/body")
        assert response.status_code == 200
        return response.content
    if path == "export":
        response = client.get("/messages/export", {"queue": message.source_queue})
        [line] = b"".join(response.streaming_content).decode().splitlines()
        line = json.loads(line)
        return line["headers"].__repr__().encode() + base64.b64decode(line["body_base64"])
    if path == "groups":
        return client.get("/groups/").content
    assert path == "group_page"
    return client.get(f"/groups/{message.group_key}/").content


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", SHAPES)
def test_it_hides_what_a_json_path_masks_on_every_shape_and_path(
    client, api, path_rules, proto, name, path
):
    fields, secret = shape(name, proto)
    queue = f"shapes.{name}"
    message = make_message(source_queue=queue, group_key=f"g-{name}", **fields)
    exporter = make_user("exa", "viewer")
    set_privileges(exporter, export=True)
    client.force_login(exporter)
    api.as_user(exporter)
    shown = shown_on(path, client, api, message)
    assert_hidden(secret, shown)
    message.refresh_from_db()
    assert secret.encode() in message.body_bytes or name in ("utf16", "base64")  # stored as is


@pytest.mark.parametrize(
    "body, masked",
    [
        # every occurrence of a repeated key masked, and still shown
        (
            b'{"card": {"number": "%s"}, "card": {"number": "2"}}' % CARD.encode(),
            b'{"card": {"number": "[masked]"}, "card": {"number": "[masked]"}}',
        ),
        # NDJSON masked line by line; a line no path reaches kept as it was
        (
            b'{"n":1}\n{"card": {"number": "%s"}}\n' % CARD.encode(),
            b'{"n":1}\n{"card": {"number": "[masked]"}}\n',
        ),
        # the BOM is kept
        (
            b'\xef\xbb\xbf{"card": {"number": "%s"}}' % CARD.encode(),
            b'\xef\xbb\xbf{"card": {"number": "[masked]"}}',
        ),
        # Latin-1 written back as Latin-1
        (
            '{"n": "Müller", "card": {"number": "%s"}}'.encode("latin-1") % CARD.encode(),
            '{"n": "Müller", "card": {"number": "[masked]"}}'.encode("latin-1"),
        ),
        # UTF-16 written back as UTF-16, with its BOM
        (
            CARD_DOC.encode("utf-16"),
            '{"card": {"number": "[masked]"}}'.encode("utf-16"),
        ),
        # UTF-16 without a BOM (RFC 4627's null bytes)
        (
            CARD_DOC.encode("utf-16-be"),
            '{"card": {"number": "[masked]"}}'.encode("utf-16-be"),
        ),
    ],
)
def test_it_masks_each_shape_exactly_and_keeps_its_encoding(client, viewer, body, masked):
    MaskRule.objects.create(kind="json_path", pattern="$.card.number")
    message = make_message(body=body)
    client.force_login(viewer)
    assert client.get(f"/messages/{message.pk}/body").content == masked


@pytest.mark.parametrize(
    "body, why",
    [
        (b'{"card": {"number": "%s"' % CARD.encode(), "Expecting"),  # a cut document
        (b'{"n": 1}\n{"card": %s\n' % CARD.encode(), "line 2 of 3"),  # a bad NDJSON line
        (b"[INFO] card %s declined" % CARD.encode(), "Expecting value"),  # starts as JSON
    ],
)
def test_it_withholds_a_body_that_looks_like_json_but_does_not_parse(
    client, api, viewer, body, why
):
    MaskRule.objects.create(kind="json_path", pattern="$.card.number")
    message = make_message(body=body)
    client.force_login(viewer)
    download = client.get(f"/messages/{message.pk}/body").content.decode()
    assert download.startswith(WITHHELD_JSON) and why in download and CARD not in download
    page = client.get(f"/messages/{message.pk}/").content.decode()
    assert CARD not in page and "a JSON-path masking rule applies here" in page
    data = api.as_user(viewer).get(f"/api/v1/messages/{message.pk}").json()
    assert base64.b64decode(data["body_base64"]).decode().startswith(WITHHELD_JSON)


def test_it_leaves_a_text_body_that_does_not_start_as_json_to_the_regexes(client, viewer):
    MaskRule.objects.create(kind="json_path", pattern="$.card.number")
    message = make_message(body=b"card 4111 declined", content_type="text/plain")
    client.force_login(viewer)
    assert client.get(f"/messages/{message.pk}/body").content == b"card 4111 declined"


def test_it_masks_a_short_encoded_sample_decoded_and_withholds_a_cut_one(client, viewer):
    MaskRule.objects.create(kind="json_path", pattern="$.card.number")
    short = base64.b64encode(_json({"card": {"number": CARD}}).encode())
    make_message(body=short, content_encoding="base64", group_key="g-short")
    cut = base64.b64encode(_json({"pad": "x" * 400, "card": {"number": CARD}}).encode())
    make_message(body=cut, content_encoding="base64", group_key="g-cut")
    client.force_login(viewer)
    page = html.unescape(client.get("/groups/").content.decode())
    assert '{"card": {"number": "[masked]"}}' in page
    assert "(masked: open a message to see its body)" in page
    assert base64.b64encode(CARD.encode()).decode()[:12] not in page


def test_it_logs_a_group_page_previews_as_body_views(client, viewer):
    MaskRule.objects.create(kind="json_path", pattern="$.card.number")
    first = make_message(group_key="g-1")
    second = make_message(group_key="g-1")
    make_message(group_key="g-other")
    client.force_login(viewer)
    assert client.get("/groups/g-1/").status_code == 200
    views = Activity.objects.filter(action="body_view", user=viewer)
    assert sorted((v.message_id, v.detail["how"], v.detail["unmasked"]) for v in views) == [
        (first.pk, "group_preview", False),
        (second.pk, "group_preview", False),
    ]


def test_it_logs_nothing_for_a_metadata_only_caller_on_a_group_page(client, viewer):
    make_message(group_key="g-1")
    set_privileges(viewer, bodies=False)
    client.force_login(viewer)
    assert "(metadata only: no body)" in client.get("/groups/g-1/").content.decode()
    assert not Activity.objects.filter(action="body_view").exists()


PERSON = "alice.smith@corp.example"


def _labelled(**fields):
    from recovery.collector.rows import failure_group

    headers = {"x-exception-message": f"declined for {PERSON}", "x-exception-type": "E"}
    key, label = failure_group("orders", "rejected", headers)
    return make_message(headers=headers, group_key=key, group_label=label, **fields)


def test_it_masks_the_history_labels_and_details(client, viewer):
    MaskRule.objects.create(kind="header", pattern="x-exception-message")
    MaskRule.objects.create(kind="regex", pattern=r"tok_live_[0-9a-f]+")
    kept = _labelled()
    gone = _labelled()
    MessageHistory.record_messages([kept.pk, gone.pk], "discard", detail="quoted tok_live_9f8e")
    client.force_login(viewer)
    page = client.get("/history/").content.decode()
    assert PERSON not in page and "tok_live_9f8e" not in page
    assert page.count("orders · rejected · E · [masked]") == 2
    # Retention deleted both: no headers left to cut the value out, the exception part goes.
    kept.delete()
    gone.delete()
    page = client.get("/history/").content.decode()
    assert PERSON not in page and page.count("orders · rejected · [masked]") == 2


def test_it_masks_the_overview_alert_tooltips(client, viewer):
    MaskRule.objects.create(kind="regex", pattern=r"tok_live_[0-9a-f]+")
    AlertRule.objects.create(
        name="watch",
        kind="open_messages",
        state=AlertRule.State.FIRING,
        last_summary="3 messages quoting tok_live_9f8e",
    )
    client.force_login(viewer)
    page = client.get("/").content.decode()
    assert "tok_live_9f8e" not in page and 'title="3 messages quoting [masked]"' in page


def test_it_shows_a_message_no_rule_reaches_plain_and_editable(client, viewer):
    MaskRule.objects.create(kind="json_path", pattern="$.card.number")
    MaskRule.objects.create(kind="header", pattern="authorization")
    plain = make_message(body=b'{"order": 7}', headers={"x-trace": "t"})
    operator = make_user("oona", "operator")
    set_privileges(operator, unmask=True)
    client.force_login(operator)
    page = client.get(f"/messages/{plain.pk}/").content.decode()
    assert 'id="masked-notice"' not in page and 'id="unmask-form"' not in page
    assert 'id="edit-link"' in page and "Download raw" in page
    assert client.get(f"/messages/{plain.pk}/edit").status_code == 200
    view = Activity.objects.get(action="body_view", message=plain, detail__how="detail")
    assert view.detail["unmasked"] is True


def test_it_says_masked_and_offers_the_unmask_once_a_rule_changes_something(client, viewer):
    MaskRule.objects.create(kind="json_path", pattern="$.card.number")
    secret = make_message(body=_json({"card": {"number": CARD}}).encode())
    operator = make_user("oona", "operator")
    set_privileges(operator, unmask=True)
    client.force_login(operator)
    page = client.get(f"/messages/{secret.pk}/").content.decode()
    assert 'id="masked-notice"' in page and 'id="edit-link"' not in page
    assert ">Unmask for 15 min</button>" in page
    assert client.get(f"/messages/{secret.pk}/edit").status_code == 302


def test_it_counts_an_edited_copy_a_rule_reaches_as_masked(client, viewer):
    from recovery.models import MessageEdit, ReplayAttempt

    MaskRule.objects.create(kind="json_path", pattern="$.card.number")
    message = make_message(body=b'{"order": 7}')
    operator = make_user("oona", "operator")
    attempt = ReplayAttempt.objects.create(
        message=message, user=operator, outcome="confirmed", edited=True
    )
    MessageEdit.objects.create(
        message=message,
        user=operator,
        body=_json({"card": {"number": CARD}}).encode(),
        attempt=attempt,
    )
    client.force_login(viewer)
    page = client.get(f"/messages/{message.pk}/").content.decode()
    assert 'id="masked-notice"' in page and CARD not in page


def test_it_does_not_count_a_cut_sample_as_a_trial_match():
    from recovery.masking.trial import SAMPLE_BODY_BYTES, sample_matches

    rule = MaskRule.objects.create(kind="json_path", pattern="$.card.number")
    make_message(body=json.dumps({"pad": "x" * SAMPLE_BODY_BYTES, "other": 1}).encode())
    make_message(body=CARD_DOC.encode())
    assert sample_matches([rule]) == {rule.pk: (1, 2)}
