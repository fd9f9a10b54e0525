"""Free-text search (recovery.filters.search_q), shared by the console, the API and jobs."""

import pytest
from django.db import connection, transaction

from recovery.filters import MessageFilterForm, bytea_escape
from recovery.models import Message
from tests.console.conftest import make_message

pytestmark = pytest.mark.django_db


def search(text):
    form = MessageFilterForm({"q": text})
    assert form.is_valid(), form.errors
    return sorted(form.apply().values_list("message_id", flat=True))


@pytest.fixture
def corpus():
    make_message(message_id="order-7f3a", correlation_id="trace-991", body=b'{"sku": "BLUE-42"}')
    make_message(message_id="m2", headers={"tenant": "Acme Corp", "x-exception-type": "Timeout"})
    make_message(message_id="m3", body="crème brûlée".encode())
    make_message(message_id="m4", body=b"\x00\xff binary 100% sure_thing \\path")
    make_message(message_id="ab", group_key="deadbeef" * 5)


def test_it_finds_exact_ids_and_group_keys(corpus):
    assert search("order-7f3a") == ["order-7f3a"]
    assert search("trace-991") == ["order-7f3a"]
    assert search("deadbeef" * 5) == ["ab"]


def test_it_finds_substrings_of_ids_headers_and_bodies_ignoring_case(corpus):
    assert search("7F3A") == ["order-7f3a"]
    assert search("acme corp") == ["m2"]
    assert search("timeout") == ["m2"]
    assert search("blue-42") == ["order-7f3a"]
    assert search("binary") == ["m4"]


def test_it_finds_non_ascii_body_text(corpus):
    assert search("brûlée") == ["m3"]
    assert search("crème") == ["m3"]


def test_like_wildcards_and_backslashes_are_literal(corpus):
    assert search("100%") == ["m4"]
    assert search("e_t") == ["m4"]
    assert search("s_e") == []  # "_" must not match any character
    assert search("\\path") == ["m4"]
    assert search("%%%") == []


def test_a_term_too_short_for_trigrams_matches_ids_exactly_only(corpus):
    assert search("ab") == ["ab"]
    assert search("m2") == ["m2"]
    assert search("rd") == []


def test_bytea_escape_matches_postgresql():
    with connection.cursor() as cur:
        for text in ["plain", "crème", "a\\b", "日本"]:
            cur.execute("SELECT encode(convert_to(%s, 'UTF8'), 'escape')", [text])
            assert cur.fetchone()[0] == bytea_escape(text), text


def test_search_uses_the_trigram_index(corpus):
    """If SEARCH_DOCUMENT_SQL drifts from migration 0004, this plan loses msg_search_trgm."""
    form = MessageFilterForm({"q": "acme corp"})
    assert form.is_valid()
    queryset = form.apply()
    with transaction.atomic(), connection.cursor() as cur:
        # Tiny table: make the planner show whether a bitmap scan over the indexes is possible.
        cur.execute("SET LOCAL enable_seqscan = off")
        cur.execute("SET LOCAL enable_indexscan = off")
        sql, params = queryset.query.sql_with_params()
        cur.execute("EXPLAIN " + sql, params)
        plan = "\n".join(row[0] for row in cur.fetchall())
    assert "Bitmap Index Scan on msg_search_trgm" in plan, plan


def test_the_message_list_searches(client, viewer, corpus):
    client.force_login(viewer)
    page = client.get("/messages/", {"q": "acme"}).content.decode()
    assert ">m2<" in page and "order-7f3a" not in page
    assert Message.objects.count() == 5


def test_a_selective_search_is_listed_from_its_matches(corpus, monkeypatch):
    """Few matches: the page is read by primary key, never by walking the newest-first index."""
    from recovery import filters

    form = MessageFilterForm({"q": "acme corp"})
    assert form.is_valid()
    narrowed = filters.narrow_search(form.apply(), form.cleaned_data)
    assert sorted(narrowed.values_list("message_id", flat=True)) == ["m2"]
    assert '"recovery_message"."id" IN (' in str(narrowed.query)

    monkeypatch.setattr(filters, "SELECTIVE_SEARCH_LIMIT", 1)
    common = MessageFilterForm({"q": "corr-"})  # not selective: four correlation ids have it
    assert common.is_valid()
    queryset = common.apply()
    assert filters.narrow_search(queryset, common.cleaned_data) is queryset
    short = MessageFilterForm({"q": "ab"})
    assert short.is_valid()
    assert filters.narrow_search(short.apply(), short.cleaned_data).query is not None


def test_a_search_that_runs_too_long_is_stopped_with_advice(client, viewer, corpus, monkeypatch):
    from console.views import messages

    monkeypatch.setattr(messages, "SEARCH_TIMEOUT_MS", 1)
    client.force_login(viewer)
    monkeypatch.setattr(
        "recovery.filters.SEARCH_DOCUMENT_SQL",
        "(SELECT message_id || pg_sleep(0.05)::text)",
    )
    response = client.get("/messages/", {"q": "acme"})
    assert response.status_code == 200
    assert "The search took longer than" in response.content.decode()
    assert client.get("/messages/").status_code == 200  # the next request is unaffected


def test_a_long_term_matches_whole_not_just_its_indexed_tail():
    make_message(message_id="order-000000000001-eu", body=b"x")
    make_message(message_id="retry-000000000001-eu", body=b"ORDER-000000000001-EU again")
    make_message(message_id="other", body="prix: 100% crème brûlée, sûre".encode())
    assert search("order-000000000001-eu") == ["order-000000000001-eu", "retry-000000000001-eu"]
    assert search("order-000000000001-EU") == ["order-000000000001-eu", "retry-000000000001-eu"]
    assert search("rder-000000000001-eu") == ["order-000000000001-eu", "retry-000000000001-eu"]
    assert search("xorder-000000000001-eu") == []
    assert search("100% crème brûlée") == ["other"]
    assert search("100_ crème brûlée") == []
