"""Role × endpoint matrix: every operation, every persona, the exact status — and a refused
POST changes nothing.

Roles are the console's: viewer reads, operator also acts on messages and jobs, admin also
manages tokens, alert rules and channels. ``ENDPOINTS`` must list every operation of the
schema (checked below), so a new endpoint cannot ship without its row.
"""

import re

import pytest
import yaml

from recovery.models import (
    AlertRule,
    ApiToken,
    AuditEvidence,
    DecoderRule,
    GroupMapping,
    MaskRule,
    Membership,
    Message,
    NotificationChannel,
    ReplayAttempt,
    ReplayJob,
    Role,
    Team,
    TeamScope,
)
from tests.helpers import make_user
from tests.helpers.api import make_audit, make_message

VIEWER, OPERATOR, ADMIN = Role.VIEWER, Role.OPERATOR, Role.ADMIN
ORDER = [None, VIEWER, OPERATOR, ADMIN]

# (method, path, minimum role, status when allowed, request body)
ENDPOINTS = [
    ("GET", "/api/v1/messages", VIEWER, 200, None),
    ("GET", "/api/v1/messages/{message}", VIEWER, 200, None),
    ("GET", "/api/v1/messages/{message}/body", VIEWER, 200, None),
    # Export is a privilege of its own (#32): admins hold it, other roles only when granted.
    ("GET", "/api/v1/messages/export", ADMIN, 200, None),
    # Unmask too (a reason, for UNMASK_SECONDS; the matrix message has no masking rule).
    ("POST", "/api/v1/messages/{message}/unmask", ADMIN, 200, {"reason": "matrix"}),
    ("POST", "/api/v1/messages/{message}/replay", OPERATOR, 200, {}),
    ("POST", "/api/v1/messages/{message}/discard", OPERATOR, 200, {"reason": "matrix"}),
    ("POST", "/api/v1/messages/{discarded}/restore", OPERATOR, 200, None),
    ("POST", "/api/v1/messages/discard", OPERATOR, 200, {"filters": {"queue": "matrix.none"}}),
    ("POST", "/api/v1/messages/restore", OPERATOR, 200, {"filters": {"queue": "matrix.none"}}),
    ("GET", "/api/v1/replay-jobs", VIEWER, 200, None),
    ("POST", "/api/v1/replay-jobs", OPERATOR, 201, {"message_ids": ["{message}"]}),
    ("POST", "/api/v1/replay-jobs/dry-run", VIEWER, 200, {"filters": {"queue": "matrix.q"}}),
    ("GET", "/api/v1/replay-jobs/{job}", VIEWER, 200, None),
    ("POST", "/api/v1/replay-jobs/{job}/cancel", OPERATOR, 200, None),
    ("POST", "/api/v1/replay-jobs/{paused_job}/resume", OPERATOR, 200, None),
    ("GET", "/api/v1/groups", VIEWER, 200, None),
    ("GET", "/api/v1/stats", VIEWER, 200, None),
    ("GET", "/api/v1/history", VIEWER, 200, None),
    ("GET", "/api/v1/audits", VIEWER, 200, None),
    ("GET", "/api/v1/audits/{audit}", VIEWER, 200, None),
    ("GET", "/api/v1/audits/{audit}/evidence", VIEWER, 200, None),
    ("POST", "/api/v1/audits/{audit}/replay-recoverable", OPERATOR, 201, None),
    ("GET", "/api/v1/tokens", ADMIN, 200, None),
    ("POST", "/api/v1/tokens/{token}/revoke", ADMIN, 200, None),
    ("GET", "/api/v1/me", VIEWER, 200, None),
    ("GET", "/api/v1/alert-rules", VIEWER, 200, None),
    ("POST", "/api/v1/alert-rules", ADMIN, 201, {"name": "matrix", "kind": "audit"}),
    ("GET", "/api/v1/alert-rules/{rule}", VIEWER, 200, None),
    ("PATCH", "/api/v1/alert-rules/{rule}", ADMIN, 200, {"name": "matrix 2"}),
    ("DELETE", "/api/v1/alert-rules/{rule}", ADMIN, 204, None),
    ("POST", "/api/v1/alert-rules/{rule}/mute", ADMIN, 200, {"minutes": 5}),
    ("POST", "/api/v1/alert-rules/{rule}/unmute", ADMIN, 200, None),
    ("GET", "/api/v1/alert-channels", VIEWER, 200, None),
    (
        "POST",
        "/api/v1/alert-channels",
        ADMIN,
        201,
        {"name": "matrix", "kind": "webhook", "target": "http://h/"},
    ),
    ("GET", "/api/v1/alert-channels/{channel}", VIEWER, 200, None),
    ("PATCH", "/api/v1/alert-channels/{channel}", ADMIN, 200, {"enabled": False}),
    ("DELETE", "/api/v1/alert-channels/{channel}", ADMIN, 204, None),
    ("POST", "/api/v1/alert-channels/{channel}/rotate-secret", ADMIN, 200, None),
    ("GET", "/api/v1/uncovered-queues", VIEWER, 200, None),
    ("GET", "/api/v1/broker", VIEWER, 200, None),
    ("GET", "/api/v1/teams", ADMIN, 200, None),
    ("POST", "/api/v1/teams", ADMIN, 201, {"name": "matrix team 2"}),
    ("GET", "/api/v1/teams/{team}", ADMIN, 200, None),
    ("PUT", "/api/v1/teams/{team}", ADMIN, 200, {"name": "matrix team 3"}),
    ("PATCH", "/api/v1/teams/{team}", ADMIN, 200, {"name": "matrix team 4"}),
    ("DELETE", "/api/v1/teams/{team}", ADMIN, 204, None),
    ("GET", "/api/v1/team-scopes", ADMIN, 200, None),
    ("POST", "/api/v1/team-scopes", ADMIN, 201, {"team": "{team}", "queue_pattern": "m.*"}),
    ("GET", "/api/v1/team-scopes/{team_scope}", ADMIN, 200, None),
    (
        "PUT",
        "/api/v1/team-scopes/{team_scope}",
        ADMIN,
        200,
        {"team": "{team}", "vhost": "/", "queue_pattern": "n.*", "exchange_pattern": ""},
    ),
    ("PATCH", "/api/v1/team-scopes/{team_scope}", ADMIN, 200, {"exchange_pattern": "x"}),
    ("DELETE", "/api/v1/team-scopes/{team_scope}", ADMIN, 204, None),
    ("GET", "/api/v1/team-memberships", ADMIN, 200, None),
    (
        "POST",
        "/api/v1/team-memberships",
        ADMIN,
        201,
        {"team": "{team}", "user": "token-owner", "role": "viewer"},
    ),
    ("GET", "/api/v1/team-memberships/{membership}", ADMIN, 200, None),
    (
        "PUT",
        "/api/v1/team-memberships/{membership}",
        ADMIN,
        200,
        {"team": "{team}", "user": "team-member", "role": "viewer"},
    ),
    ("PATCH", "/api/v1/team-memberships/{membership}", ADMIN, 200, {"role": "viewer"}),
    ("DELETE", "/api/v1/team-memberships/{membership}", ADMIN, 204, None),
    ("GET", "/api/v1/masking-rules", ADMIN, 200, None),
    ("POST", "/api/v1/masking-rules", ADMIN, 201, {"kind": "header", "pattern": "x-matrix"}),
    ("GET", "/api/v1/masking-rules/{mask_rule}", ADMIN, 200, None),
    (
        "PUT",
        "/api/v1/masking-rules/{mask_rule}",
        ADMIN,
        200,
        {"team": "{team}", "kind": "regex", "pattern": "m[0-9]+", "note": ""},
    ),
    ("PATCH", "/api/v1/masking-rules/{mask_rule}", ADMIN, 200, {"note": "matrix"}),
    ("DELETE", "/api/v1/masking-rules/{mask_rule}", ADMIN, 204, None),
    ("GET", "/api/v1/sso-mappings", ADMIN, 200, None),
    ("POST", "/api/v1/sso-mappings", ADMIN, 201, {"group": "matrix-ops", "role": "viewer"}),
    ("GET", "/api/v1/sso-mappings/{sso_mapping}", ADMIN, 200, None),
    (
        "PUT",
        "/api/v1/sso-mappings/{sso_mapping}",
        ADMIN,
        200,
        {"group": "matrix-oncall", "role": "", "team": "{team}", "team_role": "operator"},
    ),
    ("PATCH", "/api/v1/sso-mappings/{sso_mapping}", ADMIN, 200, {"role": "operator"}),
    ("DELETE", "/api/v1/sso-mappings/{sso_mapping}", ADMIN, 204, None),
    ("GET", "/api/v1/decoder-rules", ADMIN, 200, None),
    (
        "POST",
        "/api/v1/decoder-rules",
        ADMIN,
        201,
        {"name": "matrix json", "queue_pattern": "m.*", "decoder": "json"},
    ),
    ("GET", "/api/v1/decoder-rules/{decoder_rule}", ADMIN, 200, None),
    (
        "PUT",
        "/api/v1/decoder-rules/{decoder_rule}",
        ADMIN,
        200,
        {"name": "matrix mp", "queue_pattern": "n.*", "decoder": "msgpack"},
    ),
    ("PATCH", "/api/v1/decoder-rules/{decoder_rule}", ADMIN, 200, {"position": 5}),
    ("DELETE", "/api/v1/decoder-rules/{decoder_rule}", ADMIN, 204, None),
]
PERSONAS = ["anonymous", "no-role", "viewer", "operator", "admin"]


def persona_user(persona):
    if persona == "anonymous":
        return None
    role = None if persona == "no-role" else Role(persona)
    return make_user(f"p-{persona}", role)


def allowed(persona, minimum):
    role = None if persona in ("anonymous", "no-role") else Role(persona)
    return ORDER.index(role) >= ORDER.index(minimum)


@pytest.fixture
def objects(wired):
    owner = make_user("token-owner", VIEWER)
    # Jobs are an operator's: a job whose creator lost the operator role stops (and its resume
    # is a 409, recovery/replay/authority.py), which is not what this matrix checks.
    job_creator = make_user("job-creator", OPERATOR)
    team = Team.objects.create(name="matrix team")
    message = make_message(source_queue="matrix.q")
    audit = make_audit()
    # One recoverable message (dead-lettered, in the store) for replay-recoverable.
    AuditEvidence.objects.create(
        run=audit, kind="recoverable", message_id=message.message_id, store_id=message.pk
    )
    return {
        "message": message,
        "discarded": make_message(status="discarded", status_before_discard="pending"),
        "audit": audit,
        "token": ApiToken.issue(owner)[0],
        "job": ReplayJob.objects.create(created_by=job_creator, filters={"queue": "matrix.q"}),
        "paused_job": ReplayJob.objects.create(
            created_by=job_creator, filters={"queue": "matrix.q"}, state=ReplayJob.State.PAUSED
        ),
        "rule": AlertRule.objects.create(name="matrix rule", kind="audit"),
        "channel": NotificationChannel.objects.create(
            name="matrix channel", kind="webhook", target="http://h/"
        ),
        # A team with a member who is none of the personas: they keep their global roles.
        "team": team,
        "team_scope": TeamScope.objects.create(team=team, queue_pattern="matrix.*"),
        "membership": Membership.objects.create(
            team=team, user=make_user("team-member", None), role="operator"
        ),
        "mask_rule": MaskRule.objects.create(kind="json_path", pattern="$.matrix"),
        "sso_mapping": GroupMapping.objects.create(group="matrix-admins", role="admin"),
        "decoder_rule": DecoderRule.objects.create(
            name="matrix rule", queue_pattern="matrix.*", decoder="json"
        ),
    }


def state(objects):
    """What a refused request must not have changed."""
    message = Message.objects.get(pk=objects["message"].pk)
    discarded = Message.objects.get(pk=objects["discarded"].pk)
    token = ApiToken.objects.get(pk=objects["token"].pk)
    return (
        message.status,
        message.replay_count,
        discarded.status,
        ReplayAttempt.objects.count(),
        token.revoked_at,
        sorted(ReplayJob.objects.values_list("id", "state")),
        sorted(AlertRule.objects.values_list("id", "name", "muted_until")),
        sorted(NotificationChannel.objects.values_list("id", "enabled", "secret")),
        sorted(Team.objects.values_list("id", "name")),
        sorted(TeamScope.objects.values_list("id", "queue_pattern", "exchange_pattern")),
        sorted(Membership.objects.values_list("id", "user_id", "role")),
        sorted(MaskRule.objects.values_list("id", "team_id", "kind", "pattern", "note")),
        sorted(GroupMapping.objects.values_list("id", "group", "role", "team_id", "team_role")),
        sorted(
            DecoderRule.objects.values_list("id", "name", "position", "queue_pattern", "decoder")
        ),
    )


@pytest.mark.django_db
@pytest.mark.parametrize("persona", PERSONAS)
@pytest.mark.parametrize(
    "method,path,minimum,ok_status,body", ENDPOINTS, ids=[f"{m} {p}" for m, p, *_ in ENDPOINTS]
)
def test_role_matrix(api_as, objects, persona, method, path, minimum, ok_status, body):
    client = api_as(persona_user(persona))
    ids = {name: obj.pk for name, obj in objects.items()}
    url = path.format(**ids)
    if body and "message_ids" in body:
        body = {"message_ids": [int(i.format(**ids)) for i in body["message_ids"]]}
    if body and body.get("team") == "{team}":
        body = {**body, "team": ids["team"]}
    before = state(objects)
    response = client.request(method, url, body)
    if persona == "anonymous":
        assert response.status_code == 401, response.content
        assert response["WWW-Authenticate"] == "Token"
    elif not allowed(persona, minimum):
        assert response.status_code == 403, response.content
    else:
        assert response.status_code == ok_status, response.content
    if response.status_code >= 400:
        assert response["Content-Type"] == "application/problem+json"
        assert response.json()["status"] == response.status_code
        assert state(objects) == before


@pytest.mark.django_db
def test_the_matrix_covers_every_operation_in_the_schema(client):
    schema = yaml.safe_load(client.get("/api/schema/").content)
    documented = {
        (method.upper(), path)
        for path, operations in schema["paths"].items()
        for method in operations
        if method in ("get", "post", "put", "patch", "delete")
    }
    in_matrix = {(method, re.sub(r"\{\w+\}", "{id}", path)) for method, path, *_ in ENDPOINTS}
    assert documented == in_matrix


@pytest.mark.django_db
def test_an_inactive_users_token_is_refused(api_as, objects):
    user = make_user("gone", ADMIN)
    client = api_as(user)
    user.is_active = False
    user.save()
    assert client.get("/api/v1/me").status_code == 401


@pytest.mark.django_db
def test_a_role_change_applies_to_existing_tokens_at_once(api_as):
    from recovery.models import set_role

    user = make_user("demoted", OPERATOR)
    client = api_as(user)
    assert client.get("/api/v1/me").json()["role"] == "operator"
    set_role(user, VIEWER)
    message = make_message()
    assert client.post(f"/api/v1/messages/{message.pk}/replay").status_code == 403
