"""Tokens: hashed, revocable (command and admin API), last_used, and the per-token rate limit."""

import io
import threading

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test import Client

from recovery.models import Activity, ApiRateWindow, ApiToken, hash_token
from tests.helpers import make_user


def issue(username, role="viewer"):
    out = io.StringIO()
    call_command("create_api_token", username, "--role", role, stdout=out)
    return out.getvalue().strip()


def auth(raw):
    return {"HTTP_AUTHORIZATION": f"Token {raw}"}


@pytest.mark.django_db
def test_it_stores_only_the_digest_and_records_last_use(client):
    raw = issue("team-a")
    token = ApiToken.objects.get(user__username="team-a")
    assert token.digest == hash_token(raw)
    assert not ApiToken.objects.filter(digest__contains=raw[3:]).exists()
    assert token.last_used_at is None
    assert client.get("/api/v1/me", **auth(raw)).json()["token"] == raw[:8]
    token.refresh_from_db()
    assert token.last_used_at is not None


@pytest.mark.django_db
def test_revoke_api_token_by_prefix_takes_effect_at_once(client):
    raw = issue("team-b")
    other = issue("team-c")
    assert client.get("/api/v1/me", **auth(raw)).status_code == 200
    out = io.StringIO()
    call_command("revoke_api_token", raw[:8], stdout=out)
    assert "revoked" in out.getvalue()
    assert client.get("/api/v1/me", **auth(raw)).status_code == 401
    assert client.get("/api/v1/me", **auth(other)).status_code == 200
    assert Activity.objects.filter(action="token_revoked").count() == 1


@pytest.mark.django_db
def test_revoke_api_token_by_user_and_its_refusals(client):
    first, second = issue("team-d"), issue("team-d")
    with pytest.raises(CommandError, match="either PREFIX or --user"):
        call_command("revoke_api_token")
    with pytest.raises(CommandError, match="no active token"):
        call_command("revoke_api_token", "lz_nope0")
    call_command("revoke_api_token", "--user", "team-d", stdout=io.StringIO())
    assert client.get("/api/v1/me", **auth(first)).status_code == 401
    assert client.get("/api/v1/me", **auth(second)).status_code == 401


@pytest.mark.django_db
def test_an_ambiguous_prefix_revokes_nothing():
    user = make_user("twins", "viewer")
    ApiToken.objects.create(user=user, prefix="lz_same0", digest="a" * 64)
    ApiToken.objects.create(user=user, prefix="lz_same0", digest="b" * 64)
    with pytest.raises(CommandError, match="2 active tokens"):
        call_command("revoke_api_token", "lz_same0")
    assert not ApiToken.objects.filter(revoked_at__isnull=False).exists()


@pytest.mark.django_db
def test_an_admin_lists_and_revokes_tokens_over_the_api(client):
    admin_raw = issue("root", "admin")
    victim_raw = issue("leaky", "operator")
    victim = ApiToken.objects.get(user__username="leaky")
    listing = client.get("/api/v1/tokens", {"user": "leaky"}, **auth(admin_raw)).json()
    assert [t["prefix"] for t in listing["results"]] == [victim_raw[:8]]
    assert listing["results"][0]["role"] == "operator"
    assert "digest" not in listing["results"][0]
    response = client.post(f"/api/v1/tokens/{victim.pk}/revoke", **auth(admin_raw))
    assert response.status_code == 200 and response.json()["active"] is False
    assert client.get("/api/v1/me", **auth(victim_raw)).status_code == 401
    active = client.get("/api/v1/tokens", {"active": "false"}, **auth(admin_raw)).json()
    assert [t["id"] for t in active["results"]] == [victim.pk]
    entry = Activity.objects.get(action="token_revoked")
    assert entry.user.username == "root" and entry.via == "api"


@pytest.mark.django_db
def test_the_rate_limit_answers_429_with_retry_after_per_token(client, settings):
    # An hour-long window: a window boundary inside the test is all but impossible.
    settings.API_RATE_LIMIT = "3/hour"
    raw, other = issue("busy"), issue("calm")
    codes = [client.get("/api/v1/me", **auth(raw)).status_code for _ in range(4)]
    assert codes == [200, 200, 200, 429]
    refused = client.get("/api/v1/me", **auth(raw))
    assert refused["Content-Type"] == "application/problem+json"
    assert refused.json()["code"] == "throttled"
    assert 1 <= int(refused["Retry-After"]) <= 3600
    assert client.get("/api/v1/me", **auth(other)).status_code == 200


@pytest.mark.django_db
def test_a_new_window_clears_the_tokens_old_counters(client, settings):
    import datetime

    settings.API_RATE_LIMIT = "100/min"
    raw = issue("old-windows")
    token = ApiToken.objects.get(user__username="old-windows")
    stale = datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC)
    ApiRateWindow.objects.create(scope=f"token:{token.pk}", window_start=stale, count=9)
    client.get("/api/v1/me", **auth(raw))
    assert list(ApiRateWindow.objects.values_list("count", flat=True)) == [1]


@pytest.mark.django_db(transaction=True)
def test_the_limit_is_shared_by_concurrent_connections(settings):
    """Each thread has its own database connection, as separate web processes would."""
    settings.API_RATE_LIMIT = "5/hour"
    raw = issue("parallel")
    codes = []
    lock = threading.Lock()

    def hit():
        try:
            code = Client().get("/api/v1/me", **auth(raw)).status_code
            with lock:
                codes.append(code)
        finally:
            connection.close()

    threads = [threading.Thread(target=hit) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(codes) == [200] * 5 + [429] * 3
