"""Single sign-on in Chromium, through the real provider's own login page (tests/sso/provider):
sign in, land on the console with the mapped role and team, log out of Lazarus and of the
provider, and be refused with a page when no group is mapped."""

import re

import pytest
from playwright.sync_api import expect

from recovery.models import Activity, GroupMapping, Team
from tests.sso.fixtures import PROVIDER_NAME, oidc_provider, sso_on  # noqa: F401 (fixture)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def sso_live(oidc_provider):  # noqa: F811 (the fixture imported above)
    team = Team.objects.create(name="payments")
    GroupMapping.objects.create(group="payments-oncall", team=team, team_role="operator")
    oidc_provider.reset_users()
    with sso_on(oidc_provider):
        yield oidc_provider


def sign_in_at_provider(tab, provider, username):
    tab.goto("/login/")
    tab.page.click(f"text=Sign in with {PROVIDER_NAME}")
    tab.page.wait_for_url(re.compile(re.escape(provider.issuer) + r"/interaction/"))
    expect(tab.page.locator("h1")).to_have_text("Sign in to the test provider")
    tab.screenshot("provider-login")
    tab.page.fill('input[name="login"]', username)
    tab.page.fill('input[name="password"]', f"{username}-pw")
    tab.page.click("#provider-submit")


def test_sign_in_land_in_the_team_and_log_out(tab, sso_live):
    sign_in_at_provider(tab, sso_live, "alice")
    tab.page.wait_for_url(tab.url("/"))
    expect(tab.page.locator("header .who")).to_contain_text("alice")
    expect(tab.page.locator("header .role")).to_have_text("operator")
    expect(tab.page.locator("#my-teams")).to_have_text("payments")
    # A team member: the broker-wide pages are not in their menu.
    expect(tab.page.locator('nav a[href="/broker/"]')).to_have_count(0)
    tab.screenshot("signed-in")

    tab.page.click("header .who button")
    # The provider asks to end its own session too (RP-initiated logout).
    tab.page.wait_for_url(re.compile(re.escape(sso_live.issuer) + r"/session/end"))
    tab.page.click('button[name="logout"]')
    tab.page.wait_for_url(re.compile(re.escape(tab.url("/login/"))))
    expect(tab.page.locator(f"text=Sign in with {PROVIDER_NAME}")).to_be_visible()
    tab.goto("/")
    assert "/login/" in tab.page.url  # logged out of Lazarus

    # And out of the provider: signing in again asks for the password again.
    tab.page.click(f"text=Sign in with {PROVIDER_NAME}")
    tab.page.wait_for_url(re.compile(re.escape(sso_live.issuer) + r"/interaction/"))
    expect(tab.page.locator("h1")).to_have_text("Sign in to the test provider")


def test_unmapped_group_is_refused_with_a_page(tab, sso_live):
    sign_in_at_provider(tab, sso_live, "carol")
    expect(tab.page.locator("#sso-refused")).to_contain_text("None of your groups")
    expect(tab.page.locator("#sso-refused")).to_contain_text("marketing")
    tab.screenshot("refused")
    assert tab.page.locator("header .who").count() == 0  # not signed in
    refusal = Activity.objects.get(action="login_refused")
    assert refusal.detail["username"] == "carol"


def test_an_admin_maps_a_group_then_its_member_signs_in(new_tab, sso_live):
    from tests.helpers import make_user

    make_user("root", "admin")
    context, admin = new_tab()
    try:
        admin.login("root")
        admin.goto("/sso/mappings/")
        admin.page.fill('input[name="group"]', "platform-admins")
        admin.page.select_option('select[name="role"]', "admin")
        admin.page.click('#sso-mapping-form button[type="submit"]')
        expect(admin.page.locator("#sso-mappings")).to_contain_text("platform-admins")
        expect(admin.page.locator("#sso-mappings")).to_contain_text("admin (global)")
        admin.screenshot("mapped")
    finally:
        context.close()

    context, bob = new_tab()
    try:
        sign_in_at_provider(bob, sso_live, "bob")
        bob.page.wait_for_url(bob.url("/"))
        expect(bob.page.locator("header .role")).to_have_text("admin")
        expect(bob.page.locator('nav a[href="/sso/mappings/"]')).to_have_count(1)
    finally:
        context.close()
