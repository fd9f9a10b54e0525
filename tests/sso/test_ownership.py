"""Who owns what at sign-in (#46 item 14, docs/security.md "Single sign-on"): the provider owns
a user's teams and the role in each; Lazarus owns each membership's privileges and an admin's
removal of a member; an existing Lazarus name is linked to a provider account only on a verified
matching email, and a name taken by someone else is a refusal that says so. Against the real
provider (tests/sso/provider), the admin's side through the console and the API."""

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from recovery.models import (
    Activity,
    GroupMapping,
    Membership,
    MembershipRemoval,
    SsoIdentity,
    Team,
)
from tests.helpers.api import ApiClient
from tests.sso.fixtures import provider_sign_in

pytestmark = pytest.mark.django_db


@pytest.fixture
def billing():
    team = Team.objects.create(name="billing")
    GroupMapping.objects.create(group="staff", team=team, team_role="viewer")
    return team


@pytest.fixture
def admin_console(admin_user):
    console = Client()
    console.force_login(admin_user)
    return console


def _privileges(user, team):
    membership = Membership.objects.get(user=user, team=team)
    return membership.role, membership.bodies, membership.unmask, membership.export


def test_it_keeps_the_privileges_an_admin_set_when_the_provider_changes_the_role(
    client, sso, payments, admin_user
):
    assert provider_sign_in(client, "alice").status_code == 302
    alice = get_user_model().objects.get(username="alice")
    # What sign-in creates has the least privileges: metadata only, no unmask, no export.
    assert _privileges(alice, payments) == ("operator", False, False, False)

    membership = Membership.objects.get(user=alice, team=payments)
    changed = ApiClient(Client(), admin_user).request(
        "PATCH", f"/api/v1/team-memberships/{membership.pk}", {"bodies": True, "export": True}
    )
    assert changed.status_code == 200, changed.content

    # The provider's groups now give viewer in payments: the role follows, the privileges stay.
    GroupMapping.objects.create(group="payments-readers", team=payments, team_role="viewer")
    sso.set_groups("alice", ["payments-readers"])
    client.logout()
    assert provider_sign_in(client, "alice").status_code == 302
    assert _privileges(alice, payments) == ("viewer", True, False, True)
    assert Membership.objects.get(user=alice, team=payments).pk == membership.pk


def test_it_remembers_an_admins_removal_until_an_admin_adds_the_member_again(
    client, sso, payments, billing, admin_console
):
    assert provider_sign_in(client, "alice").status_code == 302  # payments-oncall, staff
    alice = get_user_model().objects.get(username="alice")
    membership = Membership.objects.get(user=alice, team=payments)
    removed = admin_console.post(f"/teams/member/{membership.pk}/delete")
    assert removed.status_code == 302

    client.logout()
    assert provider_sign_in(client, "alice").status_code == 302
    assert list(
        Membership.objects.filter(user=alice).values_list("team__name", "role", "bodies")
    ) == [("billing", "viewer", False)]
    assert MembershipRemoval.objects.filter(user=alice, team=payments).count() == 1

    added = admin_console.post(
        "/teams/",
        {
            "form": "member",
            "member-team": payments.pk,
            "member-user": "alice",
            "member-role": "viewer",
            "member-bodies": "on",
        },
    )
    assert added.status_code == 302, added.content[:500]
    assert not MembershipRemoval.objects.filter(user=alice, team=payments).exists()
    client.logout()
    assert provider_sign_in(client, "alice").status_code == 302
    # Back in payments with the provider's role and the privileges the admin gave.
    assert _privileges(alice, payments) == ("operator", True, False, False)


def test_it_refuses_a_user_an_admin_removed_from_their_only_team(
    client, sso, payments, admin_console
):
    sso.set_groups("alice", ["payments-oncall"])
    assert provider_sign_in(client, "alice").status_code == 302
    alice = get_user_model().objects.get(username="alice")
    membership = Membership.objects.get(user=alice, team=payments)
    assert admin_console.post(f"/teams/member/{membership.pk}/delete").status_code == 302

    client.logout()
    answer = provider_sign_in(client, "alice")
    assert answer.status_code == 403
    assert "A Lazarus administrator removed you from payments" in answer.content.decode()
    assert not Membership.objects.filter(user=alice).exists()
    refusal = Activity.objects.get(action="login_refused", user=alice)
    assert refusal.detail["groups"] == ["payments-oncall"]


def test_it_refuses_an_unverified_or_other_email_claiming_an_existing_username(
    client, sso, payments
):
    local = get_user_model().objects.create_user(
        "alice", email="alice@example.test", password="pw-alice-local"
    )
    # Mallory edits her profile at the provider to carry alice's name and email, unverified.
    sso.set_claims(
        "mallory",
        preferred_username="alice",
        email="alice@example.test",
        email_verified=False,
        groups=["payments-oncall"],
    )
    answer = provider_sign_in(client, "mallory")
    assert answer.status_code == 403
    assert "does not vouch that it is yours" in answer.content.decode()

    # Verified, but her own address: still not alice's account.
    sso.set_claims("mallory", email="mallory@example.test", email_verified=True)
    assert provider_sign_in(Client(), "mallory").status_code == 403

    assert not SsoIdentity.objects.exists()
    assert not Membership.objects.filter(user=local).exists()
    local.refresh_from_db()
    assert local.check_password("pw-alice-local")
    refusals = Activity.objects.filter(action="login_refused").order_by("id")
    assert [(r.detail["username"], r.detail["subject"]) for r in refusals] == [
        ("alice", "mallory"),
        ("alice", "mallory"),
    ]
    assert {r.detail["existing_user"] for r in refusals} == {local.pk}


def test_it_links_the_existing_account_when_the_provider_verifies_its_email(client, sso, payments):
    local = get_user_model().objects.create_user(
        "alice", email="Alice@Example.test", password="pw-alice-local"
    )
    sso.set_claims("alice", email_verified=True)
    answer = provider_sign_in(client, "alice")
    assert answer.status_code == 302 and answer["Location"] == "/"
    identity = SsoIdentity.objects.get()
    assert (identity.user_id, identity.issuer, identity.subject) == (local.pk, sso.issuer, "alice")
    assert get_user_model().objects.count() == 1
    assert _privileges(local, payments) == ("operator", False, False, False)
    linked = Activity.objects.get(action="sso_linked")
    assert linked.user_id == local.pk
    assert linked.detail == {"username": "alice", "issuer": sso.issuer, "subject": "alice"}


def test_it_never_links_a_superuser_even_with_a_verified_email(client, sso, payments):
    get_user_model().objects.create_superuser(
        "alice", email="alice@example.test", password="pw-break-glass"
    )
    sso.set_claims("alice", email_verified=True)
    answer = provider_sign_in(client, "alice")
    assert answer.status_code == 403
    assert "stays a local account (break-glass)" in answer.content.decode()
    assert not SsoIdentity.objects.exists()


def test_it_tells_the_owner_of_a_username_taken_at_the_provider_why_they_are_refused(
    client, sso, payments
):
    # Mallory renames herself "alice" at the provider and signs in before alice ever does.
    sso.set_claims(
        "mallory",
        preferred_username="alice",
        email="alice@example.test",
        groups=["payments-oncall"],
    )
    assert provider_sign_in(client, "mallory").status_code == 302
    squatter = get_user_model().objects.get(username="alice")
    assert squatter.sso_identity.subject == "mallory"

    # The real alice, even with a verified address, does not take that account over: she is
    # told the name belongs to another provider account, and the admin sees it.
    sso.set_claims("alice", email_verified=True)
    answer = provider_sign_in(Client(), "alice")
    assert answer.status_code == 403
    page = answer.content.decode()
    assert "already belongs to another account at the identity provider" in page
    assert "Ask a Lazarus administrator to rename or remove that account" in page
    refusal = Activity.objects.get(action="login_refused")
    assert refusal.user is None
    assert (refusal.detail["username"], refusal.detail["subject"]) == ("alice", "alice")
    assert refusal.detail["existing_user"] == squatter.pk
    assert list(SsoIdentity.objects.values_list("user_id", "subject")) == [(squatter.pk, "mallory")]
