"""Sign-in group mappings through the API (admin): a mapping made there decides the role of the
next sign-in at the real provider, a bad one is a 400 naming the field, and every change is an
activity row as on the console's Sign-in page."""

import pytest
from django.contrib.auth import get_user_model

from recovery.models import Activity, GroupMapping, Membership, Role, Team, role_of
from tests.sso.fixtures import provider_sign_in

pytestmark = pytest.mark.django_db


def test_a_mapping_made_through_the_api_gives_its_role_at_the_next_sign_in(client, admin_api, sso):
    team = Team.objects.create(name="payments")
    created = admin_api.post(
        "/api/v1/sso-mappings",
        {"group": "payments-oncall", "team": team.pk, "team_role": "viewer"},
    )
    assert created.status_code == 201, created.content
    mapping = created.json()
    assert (mapping["role"], mapping["team"], mapping["team_role"]) == ("", team.pk, "viewer")

    client.logout()
    assert provider_sign_in(client, "alice").status_code == 302
    alice = get_user_model().objects.get(username="alice")
    assert role_of(alice) == Role.VIEWER

    changed = admin_api.request(
        "PATCH", f"/api/v1/sso-mappings/{mapping['id']}", {"team_role": "operator"}
    )
    assert changed.status_code == 200, changed.content
    client.logout()
    assert provider_sign_in(client, "alice").status_code == 302
    assert list(Membership.objects.filter(user=alice).values_list("role", flat=True)) == [
        "operator"
    ]

    assert admin_api.request("DELETE", f"/api/v1/sso-mappings/{mapping['id']}").status_code == 204
    logged = Activity.objects.filter(action__startswith="sso_mapping_").order_by("id")
    assert [(a.action, a.via) for a in logged] == [
        ("sso_mapping_created", "api"),
        ("sso_mapping_changed", "api"),
        ("sso_mapping_deleted", "api"),
    ]
    assert logged[1].detail["what"] == "payments-oncall → operator in team payments"


@pytest.mark.parametrize(
    "body, field",
    [
        ({"group": "ops"}, "non_field_errors"),  # neither a global role nor a team
        (
            {"group": "ops", "role": "admin", "team": "TEAM", "team_role": "viewer"},
            "non_field_errors",
        ),
        ({"group": "ops", "team": "TEAM"}, "team_role"),
        ({"group": "ops", "role": "viewer", "team_role": "viewer"}, "team"),
        ({"group": "   ", "role": "viewer"}, "group"),
        ({"group": "o\u0007ps", "role": "viewer"}, "group"),
        ({"group": "ops", "role": "root"}, "role"),
        ({"group": "ops", "team": "1", "team_role": "viewer"}, "team"),
        ({"group": 7, "role": "viewer"}, "group"),
        ({"group": "dup", "role": "viewer"}, "non_field_errors"),  # mapped globally already
        ({"group": "dup", "team": "TEAM", "team_role": "viewer"}, "non_field_errors"),
    ],
)
def test_a_bad_mapping_is_a_400_naming_the_field_and_nothing_is_saved(admin_api, body, field):
    team = Team.objects.create(name="payments")
    GroupMapping.objects.create(group="dup", role="admin")
    GroupMapping.objects.create(group="dup", team=team, team_role="operator")
    body = {k: team.pk if v == "TEAM" else v for k, v in body.items()}
    response = admin_api.post("/api/v1/sso-mappings", body)
    assert response.status_code == 400, response.content
    assert field in response.json()["errors"], response.json()
    assert GroupMapping.objects.count() == 2
    assert not Activity.objects.filter(action__startswith="sso_mapping_").exists()


def test_a_change_into_a_duplicate_is_refused(admin_api):
    GroupMapping.objects.create(group="ops", role="admin")
    other = GroupMapping.objects.create(group="ops-2", role="viewer")
    response = admin_api.request("PATCH", f"/api/v1/sso-mappings/{other.pk}", {"group": "ops"})
    assert response.status_code == 400 and "non_field_errors" in response.json()["errors"]
    other.refresh_from_db()
    assert other.group == "ops-2"
    # Changing a mapping into what it already is is no duplicate of itself.
    same = admin_api.request(
        "PUT", f"/api/v1/sso-mappings/{other.pk}", {"group": "ops-2", "role": "viewer"}
    )
    assert same.status_code == 200, same.content
