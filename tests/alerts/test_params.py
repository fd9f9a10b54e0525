"""A rule's params are checked against its kind (recovery/alerts/params.py), the same way by the
API and the console form: a bad value is a 400 or a form error naming it, never a 500, and
nothing is saved. The scope's vhost must be one Lazarus watches."""

import json

import pytest
from django.conf import settings
from django.utils import timezone

from recovery.alerts.engine import evaluate
from recovery.alerts.params import PARAMS, params_problems
from recovery.models import AlertRule
from tests.helpers import make_user

pytestmark = pytest.mark.django_db

DEEP = '{"a": ' * 5000 + "1" + "}" * 5000

# (kind, params as raw JSON text): each was saved before and then broke every check, or was a 500.
BAD = [
    ("open_messages", '{"threshold": "abc"}'),
    ("open_messages", '{"threshold": [1, 2]}'),
    ("open_messages", '{"threshold": true}'),
    ("open_messages", '{"threshold": 1e20}'),
    ("open_messages", '{"threshold": -1}'),
    ("open_growth", '{"window_minutes": 0}'),
    ("open_growth", '{"per_minute": 1e20}'),
    ("new_failure_group", '{"window_minutes": 2.5}'),
    ("audit", '{"missing_after": "25:99"}'),
    ("audit", '{"warnings": 1}'),
    ("audit", '{"missing_after": 6}'),
    ("open_messages", '{"threshold": "\\u0000"}'),
    ("open_messages", '{"\\u0000": 1}'),
    ("open_messages", '{"treshold": 5}'),
    ("broker_alarm", '{"threshold": 5}'),
    ("open_messages", '{"x": {"y": {"z": {"w": {"v": 1}}}}}'),
]
# Python's json module (the console form's parser) reads these; the API's parser refuses them.
FORM_ONLY_BAD = [
    ("open_growth", '{"per_minute": NaN}'),
    ("open_growth", '{"per_minute": Infinity}'),
    ("open_messages", DEEP),
]


def test_it_accepts_every_kinds_own_defaults():
    for kind in AlertRule.Kind.values:
        defaults = {name: p.default for name, p in PARAMS[kind].items()}
        assert params_problems(kind, defaults) == [], kind
    assert set(PARAMS) == set(AlertRule.Kind.values)


@pytest.mark.parametrize(("kind", "raw"), BAD)
def test_it_refuses_bad_params_through_the_api(api, client, kind, raw):
    admin = make_user("params-admin", "admin")
    body = f'{{"name": "bad", "kind": "{kind}", "params": {raw}}}'
    response = client.post(
        "/api/v1/alert-rules", body, content_type="application/json", **api.as_user(admin).headers()
    )
    assert response.status_code == 400, response.content
    assert "params" in response.content.decode()
    assert not AlertRule.objects.exists()


@pytest.mark.parametrize(("kind", "raw"), BAD + FORM_ONLY_BAD)
def test_it_refuses_bad_params_in_the_console_form(client, kind, raw):
    client.force_login(make_user("params-form-admin", "admin"))
    response = client.post(
        "/alerts/",
        {"rule-name": "bad", "rule-kind": kind, "rule-params": raw, "rule-for_seconds": "0"},
    )
    assert response.status_code == 200
    form = response.context["rule_form"]
    assert list(form.errors) == ["params"], form.errors
    assert not AlertRule.objects.exists()


def test_it_saves_good_params_through_both(api, client):
    admin = make_user("params-good", "admin")
    made = api.as_user(admin).post(
        "/api/v1/alert-rules",
        {"name": "growth", "kind": "open_growth", "params": {"per_minute": 2.5}},
    )
    assert made.status_code == 201, made.content
    client.force_login(admin)
    response = client.post(
        "/alerts/",
        {
            "rule-name": "audit",
            "rule-kind": "audit",
            "rule-params": json.dumps({"missing_after": "07:30", "loss_ppm_above": None}),
            "rule-for_seconds": "0",
        },
    )
    assert response.status_code == 302, response.content.decode()
    assert AlertRule.objects.get(name="audit").params["missing_after"] == "07:30"


def test_it_refuses_a_vhost_lazarus_does_not_watch(api, client):
    admin = make_user("params-vhost", "admin")
    watched = settings.RECOVERY_VHOSTS[0]
    refused = api.as_user(admin).post(
        "/api/v1/alert-rules", {"name": "p", "kind": "uncovered_queues", "vhost": "payroll"}
    )
    assert refused.status_code == 400 and "vhost" in refused.json()["errors"], refused.content
    client.force_login(admin)
    page = client.post(
        "/alerts/",
        {
            "rule-name": "p",
            "rule-kind": "uncovered_queues",
            "rule-vhost": "payroll",
            "rule-for_seconds": "0",
        },
    )
    assert page.status_code == 200 and "not a vhost Lazarus watches" in page.content.decode()
    assert not AlertRule.objects.exists()
    allowed = api.as_user(admin).post(
        "/api/v1/alert-rules", {"name": "w", "kind": "collector_down", "vhost": watched}
    )
    assert allowed.status_code == 201, allowed.content


def test_a_rule_saved_with_another_vhost_reads_nothing_of_it():
    # Saved before the vhost was checked (or RECOVERY_VHOSTS changed since): the check must not
    # read, and the rule's summary must not name, that vhost's queues.
    rule = AlertRule.objects.create(
        name="payroll", kind="queue_without_consumers", vhost="payroll-secret"
    )
    evaluate(now=timezone.now())
    rule.refresh_from_db()
    assert "not one Lazarus watches" in rule.last_error
    assert rule.last_items == [] and rule.last_summary == ""


# Saved in code, or before params were checked (rules made then are still in the table): each
# raised inside its check on every evaluation, and the rule stayed a green "ok" beside it.
SAVED_BAD = [
    # AttributeError: 'int' object has no attribute 'partition' (hours typed as a number)
    ("audit", {"missing_after": 6}, "missing_after"),
    ("audit", {"missing_after": None}, "missing_after"),  # AttributeError on None
    ("open_messages", {"threshold": "abc"}, "threshold"),  # TypeError
    ("open_growth", {"window_minutes": 0}, "window_minutes"),  # ZeroDivisionError
    ("open_messages", {"treshold": 5}, "treshold"),  # checked quietly with the default threshold
]


@pytest.mark.parametrize(("kind", "params", "named"), SAVED_BAD)
def test_a_rule_saved_with_params_its_kind_does_not_take_is_unknown_saying_which(
    kind, params, named
):
    saved = AlertRule.objects.create(name="saved", kind=kind, params=params)
    evaluate(now=timezone.now())
    saved.refresh_from_db()
    assert saved.state == saved.current_state == "unknown"
    assert saved.last_error.startswith("InvalidParams: "), saved.last_error
    assert named in saved.last_error and "edit it" in saved.last_error


@pytest.mark.usefixtures("wired")
@pytest.mark.parametrize("kind", sorted(PARAMS))
def test_every_kind_checks_an_empty_store_with_its_defaults_in_every_scope(kind):
    defaults = {name: p.default for name, p in PARAMS[kind].items()}
    scopes = [
        {},
        {"vhost": settings.RECOVERY_VHOSTS[0]},
        {"queue": "nobody.q"},
        {"exchange": "nobody.x"},
        {"group_key": "0" * 64},
    ]
    for i, scope in enumerate(scopes):
        AlertRule.objects.create(name=f"{kind} {i}", kind=kind, params={}, **scope)
        AlertRule.objects.create(name=f"{kind} {i} d", kind=kind, params=defaults, **scope)
    evaluate(now=timezone.now())
    for rule in AlertRule.objects.all():
        if kind == "broker_tally":  # no sample taken: unknown by design, never ok
            assert rule.state == "unknown" and "no broker tally sample" in rule.last_error
        else:
            assert (rule.last_error, rule.last_evaluated_at is not None) == ("", True), rule
            assert rule.state in ("ok", "firing"), rule
