"""Every path that shows a message's content masks it (#32): each test carries a secret that
must never appear, and checks the stored bytes are still the original."""

import base64
import gzip
import json

import pytest

from recovery.models import Activity, MaskRule, MessageEdit, ReplayAttempt
from tests.helpers import make_message, make_user

pytestmark = pytest.mark.django_db

CARD = "4111111111111111"  # behind a JSON path
TOKEN = "tok_live_9f8e7d6c"  # behind a regular expression
HEADER_SECRET = "Bearer s3cr3t-h3ad3r"  # behind a header rule
SECRETS = (CARD, TOKEN, HEADER_SECRET)


def assert_no_secret(text):
    for secret in SECRETS:
        assert secret not in text, f"{secret!r} shown"


@pytest.fixture
def rules():
    MaskRule.objects.create(kind="json_path", pattern="$.card.number")
    MaskRule.objects.create(kind="regex", pattern=r"tok_live_[0-9a-f]+")
    MaskRule.objects.create(kind="header", pattern="Authorization")


@pytest.fixture
def secret_message(rules):
    body = json.dumps({"card": {"number": CARD}, "note": f"token {TOKEN}"}).encode()
    return make_message(
        body=body,
        headers={"authorization": HEADER_SECRET, "x-trace": "kept-trace"},
    )


@pytest.fixture
def gzipped_message(rules):
    body = gzip.compress(json.dumps({"card": {"number": CARD}, "t": TOKEN}).encode())
    return make_message(body=body, content_encoding="gzip")


def test_the_console_detail_masks_headers_body_and_decoded_form(client, viewer, secret_message):
    client.force_login(viewer)
    page = client.get(f"/messages/{secret_message.pk}/").content.decode()
    assert_no_secret(page)
    assert "[masked]" in page and "kept-trace" in page and 'id="masked-notice"' in page
    secret_message.refresh_from_db()
    assert CARD.encode() in secret_message.body_bytes  # stored bytes unchanged


def test_the_console_detail_masks_a_decoded_body(client, viewer, gzipped_message):
    client.force_login(viewer)
    page = client.get(f"/messages/{gzipped_message.pk}/").content.decode()
    assert 'id="body-decoded"' in page
    assert_no_secret(page)


def test_the_download_is_masked(client, viewer, secret_message):
    client.force_login(viewer)
    response = client.get(f"/messages/{secret_message.pk}/body")
    assert response.status_code == 200
    assert_no_secret(response.content.decode())
    assert b"[masked]" in response.content


def test_the_api_detail_is_masked(api, viewer, secret_message):
    data = api.as_user(viewer).get(f"/api/v1/messages/{secret_message.pk}").json()
    assert data["masked"] is True and data["headers"]["authorization"] == "[masked]"
    assert_no_secret(json.dumps(data))
    assert_no_secret(base64.b64decode(data["body_base64"]).decode())


def test_the_api_body_is_masked_raw_and_decoded(api, viewer, secret_message, gzipped_message):
    raw = api.as_user(viewer).get(f"/api/v1/messages/{secret_message.pk}/body")
    assert raw.status_code == 200 and b"[masked]" in raw.content
    assert_no_secret(raw.content.decode())
    decoded = api.get(f"/api/v1/messages/{gzipped_message.pk}/body", decoded="true").json()
    assert decoded["value"]["card"]["number"] == "[masked]"
    assert_no_secret(json.dumps(decoded))
    # The raw bytes of a compressed body: masked where readable, never the secret in clear.
    raw_gzip = api.get(f"/api/v1/messages/{gzipped_message.pk}/body")
    assert_no_secret(raw_gzip.content.decode("latin-1"))


def test_the_group_list_sample_is_masked(client, viewer, rules):
    make_message(body=f"token {TOKEN} failed".encode(), content_type="text/plain")
    client.force_login(viewer)
    page = client.get("/groups/").content.decode()
    assert "token [masked] failed" in page
    assert_no_secret(page)


def test_a_cut_json_sample_is_not_shown_when_paths_apply(client, viewer, rules):
    body = json.dumps({"pad": "x" * 500, "card": {"number": CARD}}).encode()
    make_message(body=body)
    client.force_login(viewer)
    page = client.get("/groups/").content.decode()
    assert "(masked: open a message to see its body)" in page


def test_the_record_of_an_edit_is_masked(client, viewer, operator, secret_message):
    attempt = ReplayAttempt.objects.create(
        message=secret_message, user=operator, outcome="confirmed", edited=True
    )
    edited = json.dumps({"card": {"number": CARD}, "t": TOKEN}).encode()
    MessageEdit.objects.create(
        message=secret_message,
        user=operator,
        headers={"authorization": HEADER_SECRET},
        body=edited,
        attempt=attempt,
    )
    client.force_login(viewer)
    page = client.get(f"/messages/{secret_message.pk}/").content.decode()
    assert "Body sent" in page and "Headers sent" in page
    assert_no_secret(page)


def test_a_team_rule_masks_the_team_messages_only(client, viewer, payments_team):
    payments = payments_team
    MaskRule.objects.create(team=payments, kind="regex", pattern=r"tok_live_[0-9a-f]+")
    theirs = make_message(source_queue="pay.cards", body=f"t={TOKEN}".encode())
    other = make_message(source_queue="hr.payroll", body=f"t={TOKEN}".encode())
    client.force_login(viewer)
    assert TOKEN not in client.get(f"/messages/{theirs.pk}/").content.decode()
    assert TOKEN in client.get(f"/messages/{other.pk}/").content.decode()


def test_every_body_view_is_in_the_activity_log(client, api, viewer, secret_message):
    client.force_login(viewer)
    client.get(f"/messages/{secret_message.pk}/")
    client.get(f"/messages/{secret_message.pk}/body")
    api.as_user(viewer).get(f"/api/v1/messages/{secret_message.pk}/body")
    api.get(f"/api/v1/messages/{secret_message.pk}")
    rows = Activity.objects.filter(action="body_view", message=secret_message, user=viewer)
    assert sorted(r.detail["how"] for r in rows) == ["api_body", "api_detail", "detail", "download"]
    # filterable by message and by user on the activity page
    page = client.get("/activity/", {"message": secret_message.pk, "user": "vera"})
    assert len(page.context["entries"]) == 4
    other = make_user("olga", "viewer")
    assert not client.get("/activity/", {"user": other.username}).context["entries"]


def test_a_group_label_made_from_a_masked_header_is_masked(client, api, viewer, rules):
    from recovery.collector.rows import failure_group

    person = "alice.smith@corp.example"
    headers = {"x-exception-message": f"declined for {person} (2 tries)", "x-exception-type": "E"}
    MaskRule.objects.create(kind="header", pattern="x-exception-message")
    key, label = failure_group("orders", "rejected", headers)
    assert person in label  # the collector kept it (its numbers become #)
    message = make_message(headers=headers, group_key=key, group_label=label)
    client.force_login(viewer)
    detail = client.get(f"/messages/{message.pk}/").content.decode()
    assert person not in detail and "orders · rejected · E · [masked]" in detail
    assert person not in client.get("/groups/").content.decode()
    assert person not in api.as_user(viewer).get(f"/api/v1/messages/{message.pk}").content.decode()
    # The overview's "What changed" panel (a new group) and the groups API show it masked too.
    overview = client.get("/").content.decode()
    assert person not in overview and "orders · rejected · E · [masked]" in overview
    groups = api.as_user(viewer).get("/api/v1/groups")
    assert groups.status_code == 200 and person not in groups.content.decode()
    assert [g["label"] for g in groups.json()["results"]] == ["orders · rejected · E · [masked]"]
    client.force_login(make_user("oona", "operator"))
    flow = client.get("/jobs/new", {"group": key}).content.decode()
    assert person not in flow and "failure group orders · rejected · E · [masked]" in flow


@pytest.mark.parametrize(
    "encoding, content_type, encode, decode",
    [
        ("gzip", "application/json", gzip.compress, gzip.decompress),
        ("base64", "application/json", base64.b64encode, base64.b64decode),
        ("", "application/msgpack", None, None),
        ("gzip", "text/plain", gzip.compress, gzip.decompress),
    ],
)
def test_encoded_bodies_are_masked_in_every_raw_form(
    client, api, viewer, rules, encoding, content_type, encode, decode
):
    import msgpack

    document = {"card": {"number": CARD}, "t": TOKEN}
    if content_type == "application/msgpack":
        raw = msgpack.packb(document)
    elif content_type == "text/plain":
        raw = encode(f"token {TOKEN} (a text body: the JSON path has nothing to reach)".encode())
    else:
        raw = encode(json.dumps(document).encode())
    message = make_message(body=raw, content_encoding=encoding, content_type=content_type)

    client.force_login(viewer)
    page = client.get(f"/messages/{message.pk}/").content.decode()
    download = client.get(f"/messages/{message.pk}/body").content
    api_raw = api.as_user(viewer).get(f"/api/v1/messages/{message.pk}/body").content
    api_detail = api.get(f"/api/v1/messages/{message.pk}").json()
    assert download == api_raw == base64.b64decode(api_detail["body_base64"])
    # What a reader gets by undoing the layers themselves: masked, as the body says it is.
    if content_type == "application/msgpack":
        readable = json.dumps(msgpack.unpackb(download))
    else:
        readable = decode(download).decode()
    assert "[masked]" in readable
    for shown in (page, readable, download.decode("latin-1"), json.dumps(api_detail)):
        assert CARD not in shown and TOKEN not in shown
    # the hex view holds no secret either
    assert CARD.encode().hex(" ")[:20] not in page


def test_a_groups_page_and_compare_are_masked(client, viewer, secret_message):
    other = make_message(
        body=json.dumps({"card": {"number": "4000000000000002"}, "note": "x"}).encode(),
        group_key=secret_message.group_key,
    )
    client.force_login(viewer)
    group = client.get(f"/groups/{secret_message.group_key}/").content.decode()
    assert_no_secret(group)
    compared = client.get("/messages/compare", {"a": secret_message.pk, "b": other.pk})
    assert compared.status_code == 200
    assert_no_secret(compared.content.decode())
    assert "[masked]" in compared.content.decode()
    views = Activity.objects.filter(action="body_view", detail__how="compare")
    assert sorted(views.values_list("message_id", flat=True)) == sorted(
        [secret_message.pk, other.pk]
    )
