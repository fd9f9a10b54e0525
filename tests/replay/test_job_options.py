"""A job's options, ids and target are judged alike by the API (a real request), the console's
job form and the engine (recovery.replay.options is their one definition)."""

import pytest
from django.core.exceptions import ValidationError

from console.forms.replay import JobForm
from recovery.replay.jobs import dry_run
from recovery.replay.options import MAX_MESSAGE_IDS, QUEUE_OR_EXCHANGE
from tests.helpers import make_user, token_for
from tests.helpers.api import ApiClient

pytestmark = pytest.mark.django_db

TOP_ID = 2**63 - 1
# The form's names for the engine's (and the API's) arguments.
FORM_NAMES = {"message_ids": "ids"}


def api_answer(client, token, arguments):
    """{field: messages} the API refuses ``arguments`` with ({} = accepted)."""
    response = (
        ApiClient(client)
        .with_token(token)
        .post("/api/v1/replay-jobs/dry-run", {"group_key": "options.g", **arguments})
    )
    assert response.status_code in (200, 400), response.content
    errors = response.json().get("errors", {}) if response.status_code == 400 else {}
    # A bad list element is named by its position (message_ids.0): the list is the field.
    return {name.split(".")[0]: messages for name, messages in errors.items()}


def form_answer(arguments):
    data = {"group": "options.g"}
    for name, value in arguments.items():
        if name == "message_ids":
            value = ",".join(map(str, value))
        data[FORM_NAMES.get(name, name)] = str(value)
    form = JobForm(data)
    form.is_valid()
    names = {form_name: name for name, form_name in FORM_NAMES.items()}
    return {names.get(field, field): messages for field, messages in form.errors.items()}


def engine_answer(arguments):
    try:
        dry_run(group_key="options.g", **arguments)
    except ValidationError as exc:
        return exc.message_dict
    return {}


@pytest.fixture
def answers(client):
    token = token_for(make_user("options-viewer", "viewer"))  # the dry run is open to viewers
    return lambda arguments: (
        api_answer(client, token, arguments),
        form_answer(arguments),
        engine_answer(arguments),
    )


OPTIONS = [
    # (option, accepted values, refused values)
    ("rate", [0.001, 5, 1_000_000], [0.0009, 0, -1, 1_000_001]),
    ("canary_size", [0, 5, 2_147_483_647], [-1, 2_147_483_648]),
    ("canary_pause_seconds", [0, 1.5, 86400], [-0.5, 86400.5]),
    ("canary_max_failure_pct", [0.001, 50, 100], [0, -1, 100.5]),
    ("breaker_threshold_pct", [0, 50, 100], [-1, 101]),
]


@pytest.mark.parametrize(
    ("option", "value"),
    [(option, value) for option, good, _ in OPTIONS for value in good],
)
def test_it_accepts_an_option_within_its_limits_everywhere(answers, option, value):
    assert answers({option: value}) == ({}, {}, {})


@pytest.mark.parametrize(
    ("option", "value"),
    [(option, value) for option, _, bad in OPTIONS for value in bad],
)
def test_it_refuses_an_option_beyond_its_limits_everywhere_in_the_same_words(
    answers, option, value
):
    api, form, engine = answers({option: value})

    assert list(api) == list(form) == list(engine) == [option]
    assert api[option] == form[option] == engine[option]
    assert engine[option][0].startswith("Ensure this value is ")


def test_a_canary_size_must_be_whole_everywhere(answers):
    api, form, engine = answers({"canary_size": 1.5})

    assert list(api) == list(form) == list(engine) == ["canary_size"]


@pytest.mark.parametrize(
    ("ids", "accepted"),
    [
        ([1, 2, 2], True),
        ([TOP_ID], True),
        (list(range(1, MAX_MESSAGE_IDS + 1)), True),
        (["x"], False),
        ([0], False),
        ([-3], False),
        ([TOP_ID + 1], False),
        (list(range(1, MAX_MESSAGE_IDS + 2)), False),
    ],
)
def test_message_ids_are_parsed_alike_everywhere(answers, ids, accepted):
    api, form, engine = answers({"message_ids": ids})

    expected = [] if accepted else ["message_ids"]
    assert list(api) == list(form) == list(engine) == expected


@pytest.mark.parametrize(
    ("target", "accepted"),
    [
        ({"target_queue": "q"}, True),
        ({"target_exchange": "x", "target_routing_key": "k"}, True),
        ({"target_exchange": "x"}, True),
        ({"target_queue": "q", "target_exchange": "x"}, False),
        ({"target_queue": "q", "target_routing_key": "k"}, False),
        ({"target_queue": "q", "target_exchange": "x", "target_routing_key": "k"}, False),
    ],
)
def test_a_queue_or_an_exchange_not_both_everywhere(answers, target, accepted):
    api, form, engine = answers(target)

    if accepted:
        assert (api, form, engine) == ({}, {}, {})
    else:
        assert api == form == engine == {"target_queue": [QUEUE_OR_EXCHANGE]}
