"""A fuzz pass over the console's forms (#20), as schemathesis does for the API: whatever a user
types into a filter, a page number or a form field, the answer is a page or a form error, never
a 500. Hypothesis draws hostile values (huge and negative numbers, odd date-times and offsets,
NUL and surrogate-free unicode, deep JSON); ``FUZZ_EXAMPLES`` sets how many per form."""

import base64
import datetime
import json
import os
import re
from urllib.parse import quote

import pytest
from django.contrib.auth import get_user_model
from django.db import transaction
from django.http import QueryDict
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from drf_spectacular.generators import SchemaGenerator
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recovery.models import AlertRule, AuditRun, NotificationChannel, ReplayJob
from tests.helpers import make_message, make_user, token_for

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


# The walk (#46): every console URL pattern from Django's resolver and every API list from the
# OpenAPI schema, with values that broke pages before (digits int() refuses, numbers past
# Python's int-string limit and PostgreSQL's bigint, forged base64 cursors, NUL bytes) in every
# query parameter and form field a view reads. Which names a view reads is recorded as it runs
# (``RecordReads``), so a route or a field added later is walked too.


def _cursor(text):
    return base64.b64encode(text.encode()).decode()


HOSTILE = [
    "²",  # passes str.isdigit(), fails int()
    "٣",  # an Arabic-Indic digit: int() takes it
    "9" * 4301,  # past Python's int-string limit (4,300 digits)
    "9" * 20,  # past PostgreSQL's bigint
    "-9223372036854775809",
    "0",
    "a\x00b",
    "abc",  # not base64
    _cursor("p=abc"),  # a forged position on an id-ordered list
    _cursor("r=1&p=" + "9" * 30),
    _cursor("p=%00"),
    _cursor('p=["\\u0000",1]'),
    _cursor("p=" + "[" * 5000),
    _cursor("o=²&p=1"),
]
# For each name alone: one value of each kind above.
SHORT_HOSTILE = ["²", "9" * 4301, "9" * 20, "a\x00b"]
# What fills a URL parameter, by name: one of the fixture's objects, then hostile values.
FUZZ_PK = 7_400_001
PATH_VALUES = {
    "int": [str(FUZZ_PK), "9" * 20, "9" * 4301],
    "str": ["a\x00b", "9" * 4301],
}
PATH_KNOWN = {"what": "team", "key": "fuzz-group", "path": "v0/x"}
READS = set()
# Fields the walk leaves to a test of their own (none today: the login's username is walked too,
# and test_it_refuses_hostile_usernames_at_login says what it answers).
UNWALKED: dict[str, set[str]] = {}


class _Recording(QueryDict):
    """A QueryDict that notes each name read (``READS``): what a view asks for is fuzzed."""

    def __getitem__(self, key):
        READS.add(key)
        return super().__getitem__(key)

    def getlist(self, key, default=None):
        READS.add(key)
        return super().getlist(key, default)

    def __contains__(self, key):
        READS.add(key)
        return super().__contains__(key)


def _recording(data):
    copy = _Recording("", mutable=True, encoding=data.encoding)
    for key, values in data.lists():
        copy.setlist(key, values)
    copy._mutable = False
    return copy


class RecordReads:
    """Middleware (the fuzz's own): the console's request.GET and request.POST as _Recording."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if not request.path.startswith("/api/"):
            request.GET = _recording(request.GET)
            if request.method == "POST":
                request.POST = _recording(request.POST)
        return self.get_response(request)


@pytest.fixture
def walk(settings):
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, "tests.console.test_fuzz.RecordReads"]
    admin = make_user("fuzz-admin", "admin")
    # One object of each kind a URL's pk names, all with FUZZ_PK: a page with a form is reached.
    # The message's vhost is on no broker: a replay or edit the fuzz makes valid fails to connect.
    make_message(pk=FUZZ_PK, vhost="lazarus-fuzz-no-such-vhost", group_key="fuzz-group")
    ReplayJob.objects.create(
        pk=FUZZ_PK, created_by=admin, message_ids=[FUZZ_PK], state="done", total=1
    )
    AlertRule.objects.create(pk=FUZZ_PK, name="fuzz-rule", kind="open_messages", vhost="/")
    NotificationChannel.objects.create(
        pk=FUZZ_PK, name="fuzz-channel", kind="webhook", target="http://127.0.0.1:9/"
    )
    AuditRun.objects.create(pk=FUZZ_PK, date=datetime.date(2026, 11, 20))
    get_user_model().objects.create_user("fuzz-target", pk=FUZZ_PK)
    return admin


def _console_paths():
    """Every console URL pattern (Django's own admin aside: staff only, not ours), filled with
    the fixture's objects (``walked``: True) and with hostile values."""
    paths = []
    for url, converters in _patterns(get_resolver().url_patterns, ""):
        if url.startswith(("admin/", "api/")):
            continue
        fills = [(url, True)]
        for name, kind in converters:
            known = str(FUZZ_PK) if kind == "int" else PATH_KNOWN.get(name, "x")
            hostile = PATH_VALUES["int" if kind == "int" else "str"]
            fills = [
                (fill.replace(f"<{name}>", value, 1), walked and value == known)
                for fill, walked in fills
                for value in [known, *hostile]
            ]
        paths += [("/" + quote(fill, safe="/"), walked) for fill, walked in fills]
    return paths


def _patterns(entries, prefix):
    for entry in entries:
        text = prefix + str(entry.pattern)
        if isinstance(entry, URLResolver):
            yield from _patterns(entry.url_patterns, text)
        elif isinstance(entry, URLPattern):
            converters = re.findall(r"<(?:(\w+):)?(\w+)>", text)
            yield (
                re.sub(r"<(?:\w+:)?(\w+)>", r"<\1>", text),
                [(name, kind or "str") for kind, name in converters],
            )


FAILED = []


def _harmless(response, what):
    body = b"" if response.streaming else response.content
    if response.status_code >= 500 or b"Traceback" in body:
        FAILED.append(f"{what[:160]}: {response.status_code}")


def _reads(client, method, path, data=None):
    READS.clear()
    try:
        # A savepoint: a view's database error is this request's, not every later one's.
        with transaction.atomic():
            response = getattr(client, method)(path, data or {})
    except Exception as exc:  # noqa: BLE001 - the test client re-raises a view's crash
        FAILED.append(f"{method.upper()} {path[:100]} {sorted(data or {})[:3]}: {exc!r:.200}")
        return False, set(READS)
    _harmless(response, f"{method.upper()} {path}")
    return response.status_code != 405, set(READS)


# Slow: a walk of every route with every hostile value (36 s here), in make test; the quick
# loop keeps the per-page and per-field cases above.
@pytest.mark.slow
def test_it_walks_every_console_route_with_hostile_values(walk):
    client = Client()
    names = {}
    for path, walked in _console_paths():
        client.force_login(walk)  # each time: a route may be /logout/
        _ok, got = _reads(client, "get", path)
        posts, post = _reads(client, "post", path)
        if walked:  # the fill with real objects: its forms are reached
            names[path] = (got, post if posts else None)
    every = set().union(*(got | (post or set()) for got, post in names.values()))
    for path, (got, post) in names.items():
        client.force_login(walk)
        for method, read in (("get", got), ("post", post)):
            if read is None:
                continue
            # Every name any view reads, all at once (a form's POST: one value of each kind).
            for value in HOSTILE if method == "get" else SHORT_HOSTILE:
                _reads(
                    client, method, path, dict.fromkeys(every - UNWALKED.get(path, set()), value)
                )
            for name in sorted(read - UNWALKED.get(path, set())):  # each name it reads, alone
                for value in SHORT_HOSTILE:
                    _reads(client, method, path, {name: value})
    assert FAILED == [], "\n".join(FAILED)
    assert len(names) > 40  # the walk reached the routes (the resolver was not empty)


def test_it_walks_every_api_list_with_hostile_values(walk):
    schema = SchemaGenerator().get_schema(request=None, public=True)
    api = Client(HTTP_AUTHORIZATION=f"Token {token_for(walk)}")
    lists = 0
    for template, operations in schema["paths"].items():
        get = operations.get("get")
        if not get:
            continue
        path = re.sub(r"\{\w+\}", str(FUZZ_PK), template)
        params = [p["name"] for p in get.get("parameters", []) if p["in"] == "query"]
        lists += "cursor" in params
        for value in HOSTILE:
            _harmless(api.get(path, dict.fromkeys(params, value)), f"GET {path} all={value!r}")
        for name in params:
            for value in SHORT_HOSTILE:
                _harmless(api.get(path, {name: value}), f"GET {path} {name}={value!r}")
    assert FAILED == [], "\n".join(FAILED)
    assert lists > 10  # the walk reached the lists (it did not find an empty schema)


@pytest.mark.parametrize("username", ["a\x00b", "u" * 151, "u" * 256])
def test_it_refuses_hostile_usernames_at_login(client, username):
    response = client.post("/login/", {"username": username, "password": "x"})
    assert response.status_code == 400
    assert b"Not a username." in response.content
