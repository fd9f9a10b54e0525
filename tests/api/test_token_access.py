"""Token auth and roles on the foundation endpoints, plus the token command."""

import io

import pytest
from django.core.management import call_command

from recovery.models import ApiToken, hash_token
from tests.helpers.api import make_message


@pytest.mark.django_db
def test_it_refuses_anonymous_and_bad_tokens(client):
    assert client.get("/api/v1/messages").status_code == 401
    response = client.get("/api/v1/messages", HTTP_AUTHORIZATION="Token nope")
    assert response.status_code == 401


@pytest.mark.django_db
def test_a_viewer_lists_and_reads_but_gets_403_on_replay(api, viewer):
    message = make_message(body=b"{}")
    api.as_user(viewer)
    listing = api.get("/api/v1/messages", kind="dead_letter")
    assert listing.status_code == 200
    assert [m["id"] for m in listing.json()["results"]] == [message.pk]
    detail = api.get(f"/api/v1/messages/{message.pk}")
    assert detail.json()["body_base64"] == "e30="
    assert api.post(f"/api/v1/messages/{message.pk}/replay").status_code == 403
    message.refresh_from_db()
    assert message.status == "pending"


@pytest.mark.django_db
def test_a_user_without_a_role_gets_403(api, django_user_model):
    nobody = django_user_model.objects.create_user("nobody")
    assert api.as_user(nobody).get("/api/v1/messages").status_code == 403


@pytest.mark.django_db
def test_filters_are_validated_and_name_the_field(api, viewer):
    response = api.as_user(viewer).get("/api/v1/messages", kind="eaten-by-a-grue")
    assert response.status_code == 400
    assert "kind" in response.json()["errors"]


@pytest.mark.django_db
def test_replay_target_validation_names_the_field(api, operator):
    message = make_message()
    response = api.as_user(operator).post(
        f"/api/v1/messages/{message.pk}/replay", {"exchange": "x"}
    )
    assert response.status_code == 400
    assert "routing_key" in response.json()["errors"]


@pytest.mark.django_db
def test_create_api_token_prints_a_working_token_stored_hashed(client):
    out = io.StringIO()
    call_command("create_api_token", "team-billing", "--role", "operator", stdout=out)
    raw = out.getvalue().strip()
    token = ApiToken.objects.get(user__username="team-billing")
    assert token.digest == hash_token(raw) and raw not in token.digest
    response = client.get("/api/v1/messages", HTTP_AUTHORIZATION=f"Token {raw}")
    assert response.status_code == 200
    token.revoke()
    assert client.get("/api/v1/messages", HTTP_AUTHORIZATION=f"Token {raw}").status_code == 401


@pytest.mark.django_db
def test_the_schema_and_docs_are_served(client):
    schema = client.get("/api/schema/")
    assert schema.status_code == 200
    assert b"/api/v1/messages/{id}/replay" in schema.content
    assert client.get("/api/docs/").status_code == 200
