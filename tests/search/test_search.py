"""Free-text search (recovery.search.filters.search_q), shared by the console, the API and jobs.

Every search test runs twice: before the indexer ran (the documents are computed on the fly from
the unindexed newest rows) and after (read from the trigram-indexed MessageSearch table).
"""

import datetime

import psycopg
import pytest
from django.db import connection, transaction

from recovery.models import Message, MessageSearch
from recovery.search import index as search_index
from recovery.search.filters import MessageFilterForm, bytea_escape
from tests.helpers import make_message, make_user

pytestmark = pytest.mark.django_db


def search(text):
    form = MessageFilterForm({"q": text})
    assert form.is_valid(), form.errors
    return sorted(form.apply().values_list("message_id", flat=True))


@pytest.fixture(params=["unindexed", "indexed"])
def corpus(request):
    make_message(message_id="order-7f3a", correlation_id="trace-991", body=b'{"sku": "BLUE-42"}')
    make_message(message_id="m2", headers={"tenant": "Acme Corp", "x-exception-type": "Timeout"})
    make_message(message_id="m3", body="crème brûlée".encode())
    make_message(message_id="m4", body=b"\x00\xff binary 100% sure_thing \\path")
    make_message(message_id="ab", group_key="deadbeef" * 5)
    if request.param == "indexed":
        assert search_index.index_new() == 5
        assert search_index.unindexed_count() == 0


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
    search_index.index_new()
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
    assert "Bitmap Index Scan on msgsearch_trgm" in plan, plan
    # The unindexed tail is read by primary key above the mark, never by scanning the store.
    assert "Seq Scan on recovery_message" not in plan, plan


def test_a_team_members_search_is_found_by_index_not_by_scanning_the_store(corpus):
    """A team caller searches content only where they may read bodies: that condition must not
    wrap the search's IN in an OR, which PostgreSQL can only check row by row over the whole
    store (seconds at 10M messages, bench/ui.py)."""
    from recovery.access.scope import Scope
    from recovery.models import Membership, Team, TeamScope
    from recovery.search.filters import apply_filters

    team = Team.objects.create(name="search team")
    TeamScope.objects.create(team=team, queue_pattern="orders")
    member = make_user("searcher", None)
    Membership.objects.create(team=team, user=member, role="viewer")
    scope = Scope.of(member)
    search_index.index_new()
    queryset = scope.messages(apply_filters(Message.objects.all(), {"q": "acme corp"}, scope))
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("SET LOCAL enable_seqscan = off")
        sql, params = queryset.query.sql_with_params()
        cur.execute("EXPLAIN " + sql, params)
        plan = "\n".join(row[0] for row in cur.fetchall())
    assert "Bitmap Index Scan on msgsearch_trgm" in plan, plan
    assert "Seq Scan on recovery_message " not in plan and "SubPlan" not in plan, plan
    assert list(queryset.values_list("message_id", flat=True)) == ["m2"]


def test_the_message_list_searches(client, viewer, corpus):
    client.force_login(viewer)
    page = client.get("/messages/", {"q": "acme"}).content.decode()
    assert ">m2<" in page and "order-7f3a" not in page
    assert Message.objects.count() == 5


def test_a_selective_search_is_listed_from_its_matches(corpus, monkeypatch):
    """Few matches: the page is read by primary key, never by walking the newest-first index."""
    from recovery.search import filters

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
        "recovery.search.index.SEARCH_DOCUMENT_SQL",
        "(SELECT message_id || pg_sleep(0.05)::text)",
    )
    MessageSearch.objects.all().delete()  # every row is in the slow, unindexed tail
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


def test_new_messages_are_found_before_and_after_the_indexer_reaches_them():
    make_message(message_id="old-1", body=b"needle one")
    assert search_index.index_new() == 1
    make_message(message_id="new-2", body=b"needle two")  # above the mark: not indexed yet
    assert search_index.unindexed_count() == 1
    make_message(message_id="new-3", body=b"hay")
    assert search_index.unindexed_count() == 2
    assert search_index.unindexed_count(limit=1) == 1  # /healthz counts no further than that
    Message.objects.filter(message_id="new-3").delete()
    assert search("needle") == ["new-2", "old-1"]
    assert search_index.index_new() == 1
    assert search_index.unindexed_count() == 0
    assert search("needle") == ["new-2", "old-1"]
    assert search_index.index_new() == 0


def test_a_row_committed_below_the_mark_is_indexed_by_the_lookback_or_the_sweep(monkeypatch):
    """Ids commit out of order: a row may appear below the mark after the indexer passed it."""
    late = make_message(message_id="late", body=b"straggler")
    make_message(message_id="top", body=b"x")
    search_index.index_new()
    MessageSearch.objects.filter(message_id=late.pk).delete()  # as if committed after the run
    assert search("straggler") == []  # below the mark and not indexed: not found yet
    assert search_index.index_new() == 1  # the lookback finds it
    assert search("straggler") == ["late"]

    MessageSearch.objects.filter(message_id=late.pk).delete()
    monkeypatch.setattr(search_index, "LOOKBACK_IDS", 0)
    assert search_index.index_new() == 0
    assert search_index.sweep() == 1  # the hourly sweep finds what the lookback missed
    assert search("straggler") == ["late"]


def test_deleting_a_message_deletes_its_search_document():
    message = make_message(message_id="gone", body=b"bye")
    search_index.index_new()
    assert MessageSearch.objects.filter(message_id=message.pk).exists()
    Message.objects.filter(pk=message.pk).delete()
    assert not MessageSearch.objects.filter(message_id=message.pk).exists()


@pytest.mark.django_db(transaction=True)
def test_runs_never_overlap():
    make_message(message_id="m", body=b"x")
    db = connection.settings_dict  # the test database
    with psycopg.connect(
        host=db["HOST"], port=db["PORT"], user=db["USER"], dbname=db["NAME"], autocommit=True
    ) as other:
        other.execute("SELECT pg_advisory_lock(%s)", [search_index.LOCK_KEY])
        assert search_index.index_new() is None  # another run holds the lock: skip
        assert search_index.sweep() is None
        other.execute("SELECT pg_advisory_unlock(%s)", [search_index.LOCK_KEY])
    assert search_index.index_new() == 1


def test_healthz_reports_the_indexer_lag(client):
    client.force_login(make_user("lag-admin", "admin"))  # the detail is for global admins
    make_message(message_id="m", body=b"x")
    assert client.get("/healthz").json()["search_index"] == {"unindexed": 1}
    search_index.index_new()
    assert client.get("/healthz").json()["search_index"] == {"unindexed": 0}


def test_index_search_command_indexes_everything_above_the_mark():
    from io import StringIO

    from django.core.management import call_command

    for n in range(3):
        make_message(message_id=f"cmd-{n}", body=b"x")
    out = StringIO()
    call_command("index_search", "--all", stdout=out)
    assert out.getvalue().strip() == "3 messages indexed; 0 above the mark"
    assert MessageSearch.objects.count() == 3


@pytest.mark.usefixtures("clean_queues")
def test_the_indexer_leaves_the_cores_to_the_collector_during_a_flood_but_not_for_long(
    amqp, settings
):
    from django.utils import timezone

    from recovery.search.tasks import collector_backlog, index_new_messages
    from tests.helpers import wait_for

    settings.SEARCH_INDEX_DEFER_BACKLOG = 5
    settings.SEARCH_INDEX_MAX_DEFER_SECONDS = 60
    message = make_message(message_id="stored-during-a-flood")
    for _ in range(5):  # no collector runs here: they wait in its queue, as in a flood
        amqp.basic_publish("", settings.RECOVERY_DEAD_LETTER_QUEUE, b"waiting")
    wait_for(lambda: collector_backlog() >= 5, message="the backlog")

    assert index_new_messages() == 0  # it waits ...
    assert not MessageSearch.objects.filter(message_id=message.pk).exists()
    assert Message.objects.filter(pk=message.pk).exists()  # (searches read the tail meanwhile)

    # ... but never more than SEARCH_INDEX_MAX_DEFER_SECONDS behind.
    Message.objects.filter(pk=message.pk).update(
        collected_at=timezone.now() - datetime.timedelta(seconds=61)
    )
    assert index_new_messages() == 1
    assert MessageSearch.objects.filter(message_id=message.pk).exists()

    # Without a flood it indexes at once.
    amqp.queue_purge(settings.RECOVERY_DEAD_LETTER_QUEUE)
    wait_for(lambda: collector_backlog() == 0, message="the queue empty")
    fresh = make_message(message_id="stored-after-the-flood")
    assert index_new_messages() >= 1
    assert MessageSearch.objects.filter(message_id=fresh.pk).exists()


def test_a_readable_bodys_document_is_search_document_sql_over_its_row():
    """What a bulk load (bench/ui.py) writes in one statement for bodies stored as readable
    text, SEARCH_DOCUMENT_SQL over the row, is what the indexer writes; a body it decodes in
    Python is the exception, and NEEDS_DECODING_SQL says which."""
    import gzip

    make_message(body=b'{"sku": "BLUE-42", "email": "user1@example.com"}')
    make_message(headers={"tenant": "t-1", "trace": "ab" * 16, "x-exception-type": "E"})
    make_message(body="crème brûlée".encode(), correlation_id="")
    make_message(body=b"\x00\xff binary \\path", content_type="application/octet-stream")
    make_message(body=b"x" * 9000, headers={"big": "y" * 9000})
    make_message(body=gzip.compress(b'{"zipped": "inside"}'), content_encoding="gzip")
    assert search_index.index_new() == 6
    with connection.cursor() as cur:
        cur.execute(
            f"SELECT m.decodes, d.document = m.document FROM (SELECT id, "
            f"{search_index.NEEDS_DECODING_SQL} AS decodes, "
            f"{search_index.SEARCH_DOCUMENT_SQL} AS document FROM recovery_message) m "
            "JOIN recovery_messagesearch d ON d.message_id = m.id ORDER BY m.id"
        )
        rows = cur.fetchall()
    assert rows == [(False, True)] * 5 + [(True, False)]


def test_a_selective_search_is_paged_from_its_matches_without_searching_again(
    client, viewer, corpus
):
    """narrow_search's ``unsearched``: the page reads the matching ids with the other filters
    only (a message's content never changes); the trigram scan runs once per list page."""
    from django.test.utils import CaptureQueriesContext

    from recovery.search import filters

    form = MessageFilterForm({"q": "acme corp"})
    assert form.is_valid()
    others = {**form.cleaned_data, "q": ""}
    narrowed = filters.narrow_search(
        form.apply(), form.cleaned_data, filters.apply_filters(Message.objects.all(), others)
    )
    assert list(narrowed.values_list("message_id", flat=True)) == ["m2"]
    assert "ILIKE" not in str(narrowed.query)
    poisoned = filters.apply_filters(Message.objects.all(), {**others, "status": "poisoned"})
    assert not filters.narrow_search(form.apply(), form.cleaned_data, poisoned).exists()

    client.force_login(viewer)
    with CaptureQueriesContext(connection) as ctx:
        page = client.get("/messages/?q=acme+corp&kind=dead_letter")
    assert page.status_code == 200 and "m2" in page.content.decode()
    assert sum("ILIKE" in query["sql"] for query in ctx.captured_queries) == 1
