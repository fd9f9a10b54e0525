"""Bodies as a privilege (metadata only), search that is no oracle, break-glass unmask (#32)."""

import datetime
import json

import pytest
from django.utils import timezone

from recovery.models import Activity, MaskRule, Membership, Unmask, set_privileges
from recovery.search import index as search_index
from tests.helpers import make_message, make_user
from tests.helpers.teams import team

pytestmark = pytest.mark.django_db

SECRET = "zq-secret-7731-xk"


@pytest.fixture
def reader():
    return make_user("meta", "operator")


@pytest.fixture
def metadata_only(reader):
    set_privileges(reader, bodies=False)
    return reader


def masked():
    MaskRule.objects.create(kind="json_path", pattern="$.pan")
    MaskRule.objects.create(kind="header", pattern="x-note")


@pytest.fixture
def secret_and_plain():
    secret = make_message(
        body=json.dumps({"pan": SECRET}).encode(),
        headers={"x-note": SECRET},
        source_queue="orders",
    )
    plain = make_message(body=b'{"pan": "nothing here"}', source_queue="orders")
    return secret, plain


def test_metadata_only_sees_queue_reason_and_headers_but_no_body(
    client, metadata_only, secret_and_plain
):
    secret, _ = secret_and_plain
    MaskRule.objects.create(kind="header", pattern="x-note")
    client.force_login(metadata_only)
    page = client.get(f"/messages/{secret.pk}/").content.decode()
    assert "orders" in page and "rejected" in page and 'id="body-withheld"' in page
    assert SECRET not in page and "x-note" in page
    assert client.get(f"/messages/{secret.pk}/body").status_code == 403
    assert not Activity.objects.filter(action="body_view").exists()


def test_metadata_only_gets_no_body_from_the_api(api, metadata_only, secret_and_plain):
    secret, _ = secret_and_plain
    data = api.as_user(metadata_only).get(f"/api/v1/messages/{secret.pk}").json()
    assert data["body_base64"] is None and data["body_text"] is None
    assert data["body_withheld"]
    assert api.get(f"/api/v1/messages/{secret.pk}/body").status_code == 403
    assert api.get(f"/api/v1/messages/{secret.pk}/body", decoded="true").status_code == 403


def _searches(client, api, term):
    """What each search surface says about ``term``: the list's rows, the API's list, the
    counts and the by-filter count."""
    listed = client.get("/messages/", {"q": term}).context["messages_page"]
    api_rows = api.get("/api/v1/messages", q=term).json()["results"]
    stats = api.get("/api/v1/stats", q=term).json()
    by_filter = client.get("/messages/discard", {"q": term}).context["count"]
    return (
        len(listed),
        len(api_rows),
        sum(stats["by_status"].values()),
        by_filter,
    )


@pytest.mark.parametrize("indexed", [False, True])
def test_search_is_no_oracle_for_metadata_only(
    client, api, metadata_only, secret_and_plain, indexed
):
    secret, _ = secret_and_plain
    if indexed:
        search_index.index_new()
    client.force_login(metadata_only)
    api.as_user(metadata_only)
    found = _searches(client, api, SECRET)
    nonsense = _searches(client, api, "zq-never-stored-0000")
    assert found == nonsense == (0, 0, 0, 0)
    # Ids stay searchable: metadata.
    assert len(client.get("/messages/", {"q": secret.message_id}).context["messages_page"]) == 1


def test_a_body_reader_still_finds_by_content(client, api, reader, secret_and_plain):
    client.force_login(reader)
    api.as_user(reader)
    assert _searches(client, api, SECRET) == (1, 1, 1, 1)


def test_a_team_without_bodies_cannot_search_its_contents(client):
    payments = team("payments", "pay.*")
    shop = team("shop", "shop.*")
    user = make_user("mixed", None)
    Membership.objects.create(user=user, team=payments, role="viewer", bodies=False)
    Membership.objects.create(user=user, team=shop, role="viewer")
    make_message(source_queue="pay.cards", body=f"x {SECRET}".encode())
    readable = make_message(source_queue="shop.orders", body=f"y {SECRET}".encode())
    client.force_login(user)
    listed = client.get("/messages/", {"q": SECRET}).context["messages_page"]
    assert [m.pk for m in listed] == [readable.pk]


def test_unmask_needs_the_privilege_and_a_reason(client, reader, secret_and_plain):
    secret, _ = secret_and_plain
    masked()
    client.force_login(reader)
    assert client.post(f"/messages/{secret.pk}/unmask", {"reason": "x"}).status_code == 403
    set_privileges(reader, unmask=True)
    client.post(f"/messages/{secret.pk}/unmask", {"reason": "  "})
    assert not Unmask.objects.exists()
    page = client.get(f"/messages/{secret.pk}/").content.decode()
    assert SECRET not in page and 'id="unmask-form"' in page


def test_an_unmask_shows_the_body_until_it_expires(client, reader, secret_and_plain, settings):
    secret, other = secret_and_plain
    masked()
    set_privileges(reader, unmask=True)
    client.force_login(reader)
    client.post(f"/messages/{secret.pk}/unmask", {"reason": "INC-42 card declined"})
    page = client.get(f"/messages/{secret.pk}/").content.decode()
    assert SECRET in page and 'id="unmasked-notice"' in page
    logged = Activity.objects.get(action="unmask", message=secret)
    assert logged.user == reader and logged.detail["reason"] == "INC-42 card declined"
    views = Activity.objects.filter(action="body_view", message=secret, detail__unmasked=True)
    assert views.count() == 1
    # Another message is still masked; the edit page opens only while unmasked.
    assert client.get(f"/messages/{secret.pk}/edit").status_code == 200
    Unmask.objects.update(expires_at=timezone.now() - datetime.timedelta(seconds=1))
    assert SECRET not in client.get(f"/messages/{secret.pk}/").content.decode()
    assert client.get(f"/messages/{secret.pk}/edit").status_code == 302
    assert other.pk != secret.pk


def test_edit_and_replay_of_a_masked_message_needs_the_unmasked_view(
    client, reader, secret_and_plain
):
    secret, _ = secret_and_plain
    masked()
    client.force_login(reader)
    response = client.get(f"/messages/{secret.pk}/edit", follow=True)
    assert "needs the body unmasked" in response.content.decode()
    assert client.post(f"/messages/{secret.pk}/edit", {"headers": "{}"}).status_code == 302


def test_the_api_unmask_needs_the_privilege_a_reason_and_then_answers_unmasked(
    api, reader, secret_and_plain
):
    secret, _ = secret_and_plain
    masked()
    api.as_user(reader)
    url = f"/api/v1/messages/{secret.pk}"
    assert SECRET not in api.get(url).content.decode()
    assert api.post(f"{url}/unmask", {"reason": "INC-9"}).status_code == 403
    set_privileges(reader, unmask=True)
    assert api.post(f"{url}/unmask", {}).status_code == 400
    granted = api.post(f"{url}/unmask", {"reason": "INC-9"}).json()
    assert granted["message"] == secret.pk and granted["reason"] == "INC-9"
    assert SECRET in api.get(url).content.decode()
    assert SECRET.encode() in api.get(f"{url}/body").content
    logged = Activity.objects.get(action="unmask", message=secret)
    assert logged.via == "api" and logged.user == reader


def test_an_api_edit_of_a_masked_message_needs_the_unmasked_view(api, reader, secret_and_plain):
    secret, _ = secret_and_plain
    masked()
    api.as_user(reader)
    edit = {"body_text": '{"pan": "[masked]"}', "queue": "nowhere"}
    refused = api.post(f"/api/v1/messages/{secret.pk}/replay", edit)
    assert refused.status_code == 403 and "unmask it first" in refused.json()["detail"]
    assert not secret.attempts.exists()


def test_an_admin_sets_global_privileges_on_the_users_page(client, admin_user, reader):
    client.force_login(admin_user)
    assert 'id="privileges-' in client.get("/users/").content.decode()
    client.post(f"/users/{reader.pk}/privileges", {"unmask": "on", "export": "on"})
    from recovery.models import Privilege, Scope

    scope = Scope.of(reader)
    assert not scope.may(Privilege.BODIES)
    assert scope.may(Privilege.UNMASK) and scope.may(Privilege.EXPORT)
    logged = Activity.objects.get(action="privileges_changed")
    assert logged.detail["privileges"] == {"bodies": False, "unmask": True, "export": True}
    client.force_login(reader)
    assert client.post(f"/users/{reader.pk}/privileges", {"bodies": "on"}).status_code == 403


def test_me_says_which_privileges_a_caller_holds(api, metadata_only):
    set_privileges(metadata_only, bodies=False, export=True)
    assert api.as_user(metadata_only).get("/api/v1/me").json()["privileges"] == ["export"]


def test_metadata_only_gets_no_body_on_a_groups_page_or_in_compare(
    client, metadata_only, secret_and_plain
):
    secret, plain = secret_and_plain
    client.force_login(metadata_only)
    group = client.get(f"/groups/{secret.group_key}/").content.decode()
    assert SECRET not in group and "(metadata only: no body)" in group
    compared = client.get("/messages/compare", {"a": secret.pk, "b": plain.pk}).content.decode()
    body = compared[compared.index("<h2>Body</h2>") :]  # headers are metadata (no rule here)
    assert SECRET not in body and 'id="body-withheld"' in body
    assert 'id="body-same"' not in compared
    assert not Activity.objects.filter(action="body_view").exists()


def test_previous_and_next_are_no_search_oracle_for_metadata_only(
    client, metadata_only, secret_and_plain
):
    secret, plain = secret_and_plain
    client.force_login(metadata_only)
    page = client.get(f"/messages/{plain.pk}/", {"back": f"q={SECRET}"}).content.decode()
    # The secret message is newer than nothing and older than nothing in a list that finds
    # nothing by a body the caller may not read: no link to it.
    assert f"/messages/{secret.pk}/" not in page
