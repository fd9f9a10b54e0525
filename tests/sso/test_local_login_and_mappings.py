"""LOCAL_LOGIN (who may use a password) and the admins' group-mapping page."""

import pytest
from django.test import Client

from recovery.models import Activity, GroupMapping, Team
from tests.helpers import make_user
from tests.sso.fixtures import PROVIDER_NAME

pytestmark = pytest.mark.django_db


def password_login(username, password):
    client = Client()
    answer = client.post("/login/", {"username": username, "password": password})
    return client, answer


def test_local_login_all_is_the_default(settings):
    assert settings.LOCAL_LOGIN == "all"
    make_user("olga", "operator")
    client, answer = password_login("olga", "pw-olga")
    assert answer.status_code == 302
    assert client.get("/").status_code == 200


def test_local_login_superusers_refuses_other_passwords(settings, django_user_model, sso):
    settings.LOCAL_LOGIN = "superusers"
    make_user("olga", "admin")
    django_user_model.objects.create_superuser("root", password="pw-root")
    _client, refused = password_login("olga", "pw-olga")
    assert refused.status_code == 200
    page = refused.content.decode()
    assert "not a superuser" in page
    assert f"Sign in with {PROVIDER_NAME}" in page
    assert "Password login is for superusers only" in page
    client, answer = password_login("root", "pw-root")
    assert answer.status_code == 302
    assert client.get("/").status_code == 200


def test_a_password_session_ends_when_local_login_is_narrowed(settings):
    make_user("olga", "operator")
    client, _ = password_login("olga", "pw-olga")
    assert client.get("/").status_code == 200
    settings.LOCAL_LOGIN = "superusers"
    assert client.get("/").status_code == 302


def test_admin_maps_groups_to_roles_and_teams(client, admin_user):
    team = Team.objects.create(name="payments")
    client.force_login(admin_user)
    page = client.get("/sso/mappings/")
    assert page.status_code == 200
    assert "OIDC_ISSUER" in page.content.decode()  # says single sign-on is off
    answer = client.post(
        "/sso/mappings/", {"group": "payments-oncall", "team": team.pk, "team_role": "operator"}
    )
    assert answer.status_code == 302
    answer = client.post("/sso/mappings/", {"group": "platform-admins", "role": "admin"})
    assert answer.status_code == 302
    mappings = {(m.group, m.role, m.team_id, m.team_role) for m in GroupMapping.objects.all()}
    assert mappings == {
        ("payments-oncall", "", team.pk, "operator"),
        ("platform-admins", "admin", None, ""),
    }
    listed = client.get("/sso/mappings/").content.decode()
    assert "payments-oncall" in listed and "operator in team" in listed
    assert Activity.objects.filter(action="sso_mapping_created").count() == 2
    mapping = GroupMapping.objects.get(group="platform-admins")
    assert client.post(f"/sso/mappings/{mapping.pk}/delete").status_code == 302
    assert not GroupMapping.objects.filter(pk=mapping.pk).exists()
    assert Activity.objects.filter(action="sso_mapping_deleted").count() == 1


@pytest.mark.parametrize(
    "data, error",
    [
        ({"group": "g"}, "choose a global role, or a team and a role in it"),
        ({"group": "g", "role": "admin", "team": "TEAM", "team_role": "viewer"}, "not both"),
        ({"group": "g", "team": "TEAM"}, "choose the role in the team"),
        ({"group": "g", "team_role": "viewer", "role": "viewer"}, "a team role needs a team"),
        ({"group": "", "role": "viewer"}, "This field is required"),
        ({"group": "g\x01", "role": "viewer"}, "control characters"),
        ({"group": "dup", "role": "viewer"}, "already gives a global role"),
        ({"group": "dup", "team": "TEAM", "team_role": "viewer"}, "already gives a role in this"),
        ({"group": "g", "role": "owner"}, "Select a valid choice"),
    ],
)
def test_bad_mappings_are_form_errors(client, admin_user, data, error):
    team = Team.objects.create(name="payments")
    GroupMapping.objects.create(group="dup", role="admin")
    GroupMapping.objects.create(group="dup", team=team, team_role="operator")
    client.force_login(admin_user)
    data = {k: (team.pk if v == "TEAM" else v) for k, v in data.items()}
    answer = client.post("/sso/mappings/", data)
    assert answer.status_code == 400
    assert error in answer.content.decode()
    assert GroupMapping.objects.count() == 2


def test_only_admins_see_the_mapping_page(client, operator):
    client.force_login(operator)
    assert client.get("/sso/mappings/").status_code == 403
    assert client.post("/sso/mappings/", {"group": "g", "role": "admin"}).status_code == 403
    assert not GroupMapping.objects.exists()


def test_team_members_can_log_out(client):
    """Logout carries no messages: the team-scope middleware lets team members use it."""
    from recovery.models import Membership

    user = make_user("tina", None)
    Membership.objects.create(user=user, team=Team.objects.create(name="t"), role="viewer")
    client.force_login(user)
    answer = client.post("/logout/")
    assert answer.status_code == 302 and answer["Location"] == "/login/"
    assert "_auth_user_id" not in client.session


def test_the_users_page_marks_single_sign_on_users(client, admin_user, sso):
    from recovery.models import SsoIdentity

    user = make_user("alice", "viewer")
    SsoIdentity.objects.create(user=user, issuer=sso.issuer, subject="alice")
    make_user("olga", "viewer")
    client.force_login(admin_user)
    page = client.get("/users/").content.decode()
    alice_row = page.split(f'id="user-{user.pk}"', 1)[1].split("</tr>", 1)[0]
    assert "single sign-on" in alice_row
    olga_row = page.split("olga", 1)[1].split("</tr>", 1)[0]
    assert "single sign-on" not in olga_row
