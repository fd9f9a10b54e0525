"""Decoder rules through the API (admin): a protobuf rule added with its descriptor set as base64
decodes the next read of a matching body, a rule whose schema does not load is a 400 naming the
field, and every change is an activity row as on the console's Decoders page."""

import base64

import pytest

from recovery.models import Activity, DecoderRule, Role
from tests.helpers import make_message, make_user

pytestmark = pytest.mark.django_db


def test_a_protobuf_rule_added_through_the_api_decodes_the_next_read(api_as, admin_api, proto):
    descriptor_set, classes = proto
    order = classes["OrderCreated"](order_id="ord-api-5", amount=3.5)
    message = make_message(
        source_queue="app.proto.in",
        body=order.SerializeToString(),
        content_type="application/x-protobuf",
        properties={"type": "orders.v1.OrderCreated", "delivery_mode": 2},
    )
    reader = api_as(make_user("vic", Role.VIEWER))
    # Nothing says how to read it yet: no decoded document (its field names are not in the bytes).
    before = reader.get(f"/api/v1/messages/{message.pk}/body", {"decoded": "true"})
    assert b"amount" not in before.content

    created = admin_api.post(
        "/api/v1/decoder-rules",
        {
            "name": "orders protobuf",
            "position": 10,
            "queue_pattern": "app.proto*",
            "decoder": "protobuf",
            "descriptor_set_base64": base64.b64encode(descriptor_set).decode(),
        },
    )
    assert created.status_code == 201, created.content
    rule = created.json()
    assert rule["created_by"] == "ada"
    assert base64.b64decode(rule["descriptor_set_base64"]) == descriptor_set
    decoded = reader.get(f"/api/v1/messages/{message.pk}/body", {"decoded": "true"})
    assert decoded.status_code == 200, decoded.content
    assert b"ord-api-5" in decoded.content and b"amount" in decoded.content

    changed = admin_api.request(
        "PATCH", f"/api/v1/decoder-rules/{rule['id']}", {"queue_pattern": "other.*"}
    )
    assert changed.status_code == 200, changed.content
    # The descriptor set a PATCH does not name is kept.
    assert bytes(DecoderRule.objects.get().descriptor_set) == descriptor_set
    assert admin_api.request("DELETE", f"/api/v1/decoder-rules/{rule['id']}").status_code == 204
    logged = Activity.objects.filter(action__startswith="decoder_rule_").order_by("id")
    assert [(a.action, a.via) for a in logged] == [
        ("decoder_rule_created", "api"),
        ("decoder_rule_changed", "api"),
        ("decoder_rule_deleted", "api"),
    ]


@pytest.mark.parametrize(
    "body, field",
    [
        ({"decoder": "protobuf", "descriptor_set_base64": "not base64!"}, "descriptor_set_base64"),
        (
            {
                "decoder": "protobuf",
                "descriptor_set_base64": base64.b64encode(b"\xff\xfe").decode(),
            },
            "descriptor_set_base64",
        ),
        (
            {"decoder": "protobuf", "protobuf_type": "orders.v1.Nope", "DESC": True},
            "descriptor_set_base64",
        ),
        ({"decoder": "protobuf"}, "descriptor_set_base64"),
        ({"decoder": "avro", "avro_schema": '{"type": "record", "name": "X"'}, "avro_schema"),
        ({"decoder": "avro", "avro_schema": '{"type": "nonsense"}'}, "avro_schema"),
        ({"decoder": "avro_registry"}, "registry_url"),
        ({"decoder": "json", "content_encoding": "br"}, "content_encoding"),
        ({"decoder": "json", "queue_pattern": ""}, "queue_pattern"),
        ({"decoder": "yaml"}, "decoder"),
        ({"decoder": "json", "position": "1"}, "position"),
        ({"decoder": "json", "name": "taken"}, "name"),
    ],
)
def test_a_bad_rule_is_a_400_naming_the_field_and_nothing_is_saved(admin_api, proto, body, field):
    DecoderRule.objects.create(name="taken", queue_pattern="t.*", decoder="json")
    body = dict(body)
    if body.pop("DESC", False):
        body["descriptor_set_base64"] = base64.b64encode(proto[0]).decode()
    response = admin_api.post(
        "/api/v1/decoder-rules", {"name": "new rule", "queue_pattern": "q.*", **body}
    )
    assert response.status_code == 400, response.content
    assert field in response.json()["errors"], response.json()
    assert DecoderRule.objects.count() == 1
    assert not Activity.objects.filter(action__startswith="decoder_rule_").exists()
