"""Masking rules through the API (admin): a rule added there masks what the next request shows,
a bad pattern is a 400 naming the field, and every change is an activity row."""

import json

import pytest

from recovery.models import Activity, MaskRule, Role, Team
from tests.helpers import make_message, make_user

pytestmark = pytest.mark.django_db

CARD = "4111111111111111"


@pytest.fixture
def reader(api_as):
    return api_as(make_user("vic", Role.VIEWER))


def test_a_rule_added_through_the_api_masks_the_next_read_and_is_logged(admin_api, reader):
    message = make_message(body=json.dumps({"card": {"number": CARD}}).encode())
    assert CARD in reader.get(f"/api/v1/messages/{message.pk}").json()["body_text"]

    created = admin_api.post(
        "/api/v1/masking-rules",
        {"kind": "json_path", "pattern": "$.card.number", "note": "PAN"},
    )
    assert created.status_code == 201, created.content
    rule = created.json()
    assert rule["team"] is None and rule["created_by"] == "ada" and rule["note"] == "PAN"
    shown = reader.get(f"/api/v1/messages/{message.pk}").json()
    assert CARD not in shown["body_text"] and shown["masked"] is True

    changed = admin_api.request(
        "PATCH", f"/api/v1/masking-rules/{rule['id']}", {"pattern": "$.card.holder"}
    )
    assert changed.status_code == 200 and changed.json()["pattern"] == "$.card.holder"
    assert CARD in reader.get(f"/api/v1/messages/{message.pk}").json()["body_text"]

    assert admin_api.request("DELETE", f"/api/v1/masking-rules/{rule['id']}").status_code == 204
    assert not MaskRule.objects.exists()
    logged = Activity.objects.filter(action__startswith="mask_rule_").order_by("id")
    assert [(a.action, a.via, a.user.username) for a in logged] == [
        ("mask_rule_created", "api", "ada"),
        ("mask_rule_changed", "api", "ada"),
        ("mask_rule_deleted", "api", "ada"),
    ]
    assert logged[0].detail["pattern"] == "$.card.number"
    assert logged[1].detail["pattern"] == "$.card.holder"


@pytest.mark.parametrize(
    "body, field",
    [
        ({"kind": "regex", "pattern": "(unclosed"}, "pattern"),
        ({"kind": "json_path", "pattern": "card.number["}, "pattern"),
        ({"kind": "header", "pattern": "x-\u0001"}, "pattern"),
        ({"kind": "column", "pattern": "x"}, "kind"),
        ({"kind": "header", "pattern": 5}, "pattern"),
        ({"kind": "header", "pattern": "x", "team": "1"}, "team"),
        ({"kind": "header", "pattern": "x", "team": 999999}, "team"),
        ({"kind": "header"}, "pattern"),
    ],
)
def test_a_bad_rule_is_a_400_naming_the_field_and_nothing_is_saved(admin_api, body, field):
    response = admin_api.post("/api/v1/masking-rules", body)
    assert response.status_code == 400, response.content
    assert field in response.json()["errors"], response.json()
    assert not MaskRule.objects.exists()
    assert not Activity.objects.filter(action__startswith="mask_rule_").exists()


def test_a_change_that_would_not_compile_is_refused_and_the_rule_stays(admin_api):
    rule = MaskRule.objects.create(kind="regex", pattern=r"tok_[0-9a-f]+")
    response = admin_api.request(
        "PATCH", f"/api/v1/masking-rules/{rule.pk}", {"pattern": "[unclosed"}
    )
    assert response.status_code == 400 and "pattern" in response.json()["errors"]
    rule.refresh_from_db()
    assert rule.pattern == r"tok_[0-9a-f]+"
    # A kind change is checked against the pattern already stored.
    response = admin_api.request("PATCH", f"/api/v1/masking-rules/{rule.pk}", {"kind": "json_path"})
    assert response.status_code == 400 and "pattern" in response.json()["errors"]


def test_a_team_rule_masks_that_teams_messages_only(admin_api, reader):
    team = Team.objects.create(name="payments")
    team.scopes.create(queue_pattern="payments.*")
    theirs = make_message(source_queue="payments.in", body=f"card {CARD}".encode())
    others = make_message(source_queue="orders.in", body=f"card {CARD}".encode())
    created = admin_api.post(
        "/api/v1/masking-rules",
        {"kind": "regex", "pattern": "[0-9]{16}", "team": team.pk},
    )
    assert created.status_code == 201, created.content
    assert created.json()["team"] == team.pk
    assert CARD not in reader.get(f"/api/v1/messages/{theirs.pk}").json()["body_text"]
    assert CARD in reader.get(f"/api/v1/messages/{others.pk}").json()["body_text"]
    listed = admin_api.get("/api/v1/masking-rules").json()
    assert [r["pattern"] for r in listed["results"]] == ["[0-9]{16}"]
