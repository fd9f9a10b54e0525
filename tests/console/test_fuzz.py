"""A fuzz pass over the console's forms (#20), as schemathesis does for the API: whatever a user
types into a filter, a page number or a form field, the answer is a page or a form error, never
a 500. Hypothesis draws hostile values (huge and negative numbers, odd date-times and offsets,
NUL and surrogate-free unicode, deep JSON); ``FUZZ_EXAMPLES`` sets how many per form."""

import json
import os

import pytest
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import make_message, make_user

pytestmark = pytest.mark.django_db

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "40"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)

numbers = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(str),
    st.sampled_from(["", "0", "-1", "1e400", "NaN", "9223372036854775808", "0x10", "1_000"]),
)
moments = st.one_of(
    st.datetimes().map(lambda d: d.isoformat()),
    st.builds(
        lambda d, h, m, sign: f"{d.isoformat()}{sign}{h:02d}:{m:02d}",
        st.datetimes(),
        st.integers(0, 99),
        st.integers(0, 99),
        st.sampled_from("+-"),
    ),
    st.sampled_from(
        ["", "today", "2026-13-40", "0000-01-01T00:00:00Z", "9999-12-31T23:59:59-23:59"]
    ),
)
text = st.text(st.characters(exclude_categories=("Cs",)), max_size=300)
value = st.one_of(text, numbers, moments)


def deep_json(depth):
    return "[" * depth + "]" * depth


json_texts = st.one_of(
    st.recursive(
        st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), text),
        lambda children: st.one_of(
            st.lists(children, max_size=4), st.dictionaries(text, children, max_size=4)
        ),
        max_leaves=20,
    ).map(json.dumps),
    st.integers(1, 5000).map(deep_json),
    text,
)

FILTER_FIELDS = [
    "kind",
    "queue",
    "exchange",
    "reason",
    "status",
    "vhost",
    "group",
    "since",
    "until",
    "q",
    "page",
    "sort",
    "before",
    "user",
    "action",
    "via",
    "message",
    "job",
    "open_only",
    "window",
    "consumer_group",
    "metric",
]
PAGES = ["/messages/", "/groups/", "/activity/", "/jobs/", "/jobs/new", "/audits/", "/"]


@pytest.fixture
def operator_client():
    client = Client()
    client.force_login(make_user("fuzz-op", "operator"))
    make_message()
    return client


@pytest.mark.parametrize("page", PAGES)
def test_filters_never_answer_500(operator_client, page):
    @FUZZ
    @given(st.dictionaries(st.sampled_from(FILTER_FIELDS), value, max_size=6))
    def check(params):
        response = operator_client.get(page, params)
        assert response.status_code < 500, (page, params)

    check()


def test_the_edit_form_never_answers_500(operator_client):
    # A vhost no broker has: a valid edit fails to connect (a form error), so the fuzz never
    # publishes anything anywhere.
    message = make_message(vhost="lazarus-fuzz-no-such-vhost")

    @FUZZ
    @given(json_texts, text)
    def check(headers, body):
        response = operator_client.post(
            f"/messages/{message.pk}/edit", {"headers": headers, "body": body}
        )
        assert response.status_code < 500, (headers[:200], body[:200])

    check()


def test_the_new_job_form_never_answers_500(operator_client):
    fields = [
        "queue",
        "since",
        "until",
        "rate",
        "canary_size",
        "canary_pause_seconds",
        "canary_max_failure_pct",
        "breaker_threshold_pct",
        "delay_seconds",
        "ids",
        "target_queue",
        "target_exchange",
        "target_routing_key",
        "q",
    ]

    @FUZZ
    @given(st.dictionaries(st.sampled_from(fields), value, max_size=8))
    def check(form):
        form = {"queue": "no.such.queue.for.fuzz", **form}  # never starts a real job
        response = operator_client.post("/jobs/new", form)
        assert response.status_code < 500, form

    check()
