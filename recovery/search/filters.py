"""The one message filter, shared by the console list, the API and bulk replay jobs."""

import contextlib
import datetime

from django import forms
from django.db import connection, transaction
from django.db.models import Q
from django.db.models.expressions import RawSQL

from recovery.access.teams import NOTHING
from recovery.models import Kind, Message, Privilege, Reason, Status
from recovery.search import index as search_index
from recovery.search import masked as search_masked


class UTCDateTimeField(forms.DateTimeField):
    """A date-time converted to UTC: PostgreSQL refuses offsets beyond ±15:59 (a user may type
    ``+20:00``; Python accepts up to ±23:59), and UTC is what the store keeps anyway."""

    def to_python(self, value):
        value = super().to_python(value)
        if value is not None and value.tzinfo is not None:
            try:
                value = value.astimezone(datetime.UTC)
            except OverflowError:  # e.g. 0001-01-01T00:00+05:00 is before year 1 in UTC
                raise forms.ValidationError(
                    "That date-time is out of range in UTC.", code="invalid"
                ) from None
        return value


def _choices(enum):
    return [("", "any")] + list(enum.choices)


class MessageFilterForm(forms.Form):
    kind = forms.ChoiceField(choices=_choices(Kind), required=False)
    queue = forms.CharField(required=False, max_length=255)
    exchange = forms.CharField(required=False, max_length=255)
    reason = forms.ChoiceField(choices=_choices(Reason), required=False)
    status = forms.ChoiceField(choices=_choices(Status), required=False)
    vhost = forms.CharField(required=False, max_length=255)
    group = forms.CharField(required=False, max_length=64)
    since = UTCDateTimeField(required=False)
    until = UTCDateTimeField(required=False)
    q = forms.CharField(required=False, max_length=500, label="Search")

    def filter_dict(self):
        """The cleaned, non-empty filters as JSON-safe values (stored on replay jobs)."""
        data = {k: v for k, v in self.cleaned_data.items() if v not in (None, "")}
        for key in ("since", "until"):
            if key in data:
                data[key] = data[key].isoformat()
        return data

    def apply(self, queryset=None, scope=None):
        queryset = Message.objects.all() if queryset is None else queryset
        return apply_filters(queryset, self.cleaned_data, scope)


# The equality filters and the message column each one matches (the counts rollup has the same
# columns: recovery/search/groups.py answers these from it).
FILTER_COLUMNS = {
    "kind": "kind",
    "queue": "source_queue",
    "exchange": "source_exchange",
    "reason": "reason",
    "status": "status",
    "vhost": "vhost",
    "group": "group_key",
}


def apply_filters(queryset, data, scope=None):
    """``data``'s filters over ``queryset``. ``scope`` (the caller's Scope; None: the system,
    which searches everything): the free-text search reads the headers and bodies of the
    messages whose bodies the caller may read only, so a "metadata only" caller cannot find a
    message by its content (recovery.models.Privilege.BODIES)."""
    lookups = {**FILTER_COLUMNS, "since": "collected_at__gte", "until": "collected_at__lt"}
    for field, lookup in lookups.items():
        value = data.get(field)
        if value not in (None, ""):
            queryset = queryset.filter(**{lookup: value})
    q = (data.get("q") or "").strip()
    if q:
        readable = Q() if scope is None else scope.privilege_q(Privilege.BODIES)
        # A caller's search finds a masked message by its masked text only (search/masked.py);
        # the system's (scope None: a job's own re-selection) reads the stored text.
        masked = None if scope is None else search_masked.masked_q()
        queryset = queryset.filter(search_q(q, readable, masked, within=queryset))
    return queryset


# A trigram index cannot serve a shorter substring; shorter terms match ids exactly only.
MIN_SUBSTRING_LENGTH = 3


def bytea_escape(text):
    """``text`` as PostgreSQL's ``encode(convert_to(text, 'UTF8'), 'escape')`` renders it.

    Bodies are searched as escape-encoded bytes, where a non-ASCII character is a run of octal
    escapes; searching for the same run finds it.
    """
    out = []
    for byte in text.encode("utf-8"):
        if byte == 0x5C:
            out.append("\\\\")
        elif byte == 0 or byte >= 0x80:
            out.append(f"\\{byte:03o}")
        else:
            out.append(chr(byte))
    return "".join(out)


def like_contains(text):
    """An ILIKE pattern matching ``text`` anywhere, with LIKE's wildcards taken literally."""
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


# Columns a search term may equal exactly (each b-tree indexed).
EXACT = ("message_id", "correlation_id", "group_key")
# The trigram index is asked for at most this many characters of a term (see _contains). At 10M
# messages full of hex ids, a 36-character id's last 8 read about 430 GIN pages (15 ms warm),
# its last 12 about 760 (25-29 ms), each finding the one message (docs/big-store.md).
INDEXED_TAIL = 8


def search_q(text, readable=None, masked=None, within=None):
    """Exact ids and group key (b-tree indexed), and a substring of ids, header values or body.

    The substring part is case-insensitive and needs at least MIN_SUBSTRING_LENGTH characters. It
    reads the trigram-indexed search documents (recovery.models.MessageSearch) and, for messages
    the indexer has not reached yet, their document computed on the fly. Everything is one
    ``id IN (... UNION ALL ...)`` so PostgreSQL plans it as a semi-join over index scans: an OR
    of an IN-subquery and other conditions could only be checked row by row over the store.

    ``readable``: a Q of the messages whose content (headers, body) may be searched; the
    others match by their exact ids and group key only (metadata). None: every message.

    ``masked``: a Q of the messages masking rules cover (None: none). Those match by content
    only where their masked rendering holds the term: candidates among ``within`` (the
    queryset being filtered, else every message) are checked one by one
    (recovery.search.masked), so a masked value can never be found by its prefix.
    """
    exact = Q(message_id=text) | Q(correlation_id=text) | Q(group_key=text)
    if len(text) < MIN_SUBSTRING_LENGTH:
        return exact
    if readable == NOTHING:
        return exact
    content = _content_q(text)
    if masked is not None and masked != NOTHING:
        return _masked_aware(text, content, exact, readable, masked, within)
    if readable is None or readable == Q():
        return content
    # exact | (readable & content), written so that the IN stays the outer condition: the
    # content's union holds the exact arms too (exact implies content), so this is the same
    # set, and PostgreSQL finds the few candidates by index and checks each one, where an OR
    # around the IN made it scan the whole store (a team's search at 10M messages).
    return content & (exact | readable)


def _masked_aware(text, content, exact, readable, masked, within):
    """``search_q`` when masking rules cover some messages: exact ids and group key; the
    stored text of readable messages no rule covers; the masked text of the covered ones."""
    readable = Q() if readable is None else readable
    base = Message.objects.all() if within is None else within
    candidates = base.filter(readable & masked).filter(content)
    shown = Q(pk__in=search_masked.matching_ids(text, candidates))
    plain = NOTHING if masked == Q() else readable & ~masked
    # As in search_q, the IN over the content's union stays the outer condition.
    return content & (exact | plain | shown)


def _content_q(text):
    # Headers hold non-ASCII text as such, bodies as octal escapes: try both spellings.
    spellings = sorted({text, bytea_escape(text)})
    indexed_sql, indexed_params = _contains_any("document", spellings)
    tail_sql, tail_params = _contains_any(search_index.SEARCH_DOCUMENT_SQL, spellings)
    arms = [
        *[f"SELECT id FROM {search_index.MESSAGES} WHERE {column} = %s" for column in EXACT],
        f"SELECT message_id FROM {search_index.DOCUMENTS} WHERE {indexed_sql}",
        f"SELECT id FROM {search_index.MESSAGES} WHERE id > %s AND {tail_sql}",
    ]
    # The mark is read now, as a number, so the planner sees how few rows lie above it. A
    # queryset evaluated later reads a few already-indexed rows twice, which IN absorbs.
    params = [text] * len(EXACT) + indexed_params + [search_index.high_water()] + tail_params
    return Q(pk__in=RawSQL(" UNION ALL ".join(arms), params))


def _contains_any(document, spellings):
    """SQL (and its parameters) for: ``document`` contains any of ``spellings``."""
    parts = [_contains(document, spelling) for spelling in spellings]
    return "(" + " OR ".join(sql for sql, _ in parts) + ")", [p for _, ps in parts for p in ps]


def _contains(document, text):
    """``document`` (an SQL expression) contains ``text``, case-insensitively.

    The index's cost grows with every trigram of the pattern while its selectivity stops
    growing after a few characters (8 hex digits: one in four billion), so a
    longer term asks the index for its tail only — the tail, because ids tend to share
    prefixes (order-00012…) — and checks the whole term on the few rows that come back.
    """
    if len(text) <= INDEXED_TAIL:
        return f"{document} ILIKE %s", [like_contains(text)]
    return (
        f"({document} ILIKE %s AND strpos(lower({document}), lower(%s)) > 0)",
        [like_contains(text[-INDEXED_TAIL:]), text],
    )


# A search matching at most this many messages is listed from its matches (see narrow_search).
SELECTIVE_SEARCH_LIMIT = 1000


def narrow_search(queryset, data, unsearched=None):
    """``queryset`` (filtered with ``data``) made safe to page newest-first when it searches.

    PostgreSQL cannot estimate how many rows a substring search matches and assumes many, so
    for ``ORDER BY collected_at DESC LIMIT n`` it walks the newest-first index and tests every
    row until n match: instant for a common word, a full scan (~1 min at a million messages)
    for a rare one, which is what ids are. So ask the trigram index first, with plain index
    scans off (bitmap scans only, which never walk the store): up to SELECTIVE_SEARCH_LIMIT
    matches are then listed by primary key; more means the term is common and the index walk
    finds a page quickly. Without a substring search, ``queryset`` is returned as it is.

    ``unsearched``: the same queryset without the text search (``data``'s other filters and the
    caller's scope applied). The matches are then paged with those filters only instead of
    running the search a second time inside the page's query: a message's ids, headers and
    body never change, so the ids stay its matches, and at 10M messages the trigram index scan
    is most of a search page (bench/ui.py; docs/big-store.md).

    Evaluates one query now; the result is a lazy queryset like its input.
    """
    q = (data.get("q") or "").strip()
    if len(q) < MIN_SUBSTRING_LENGTH:
        return queryset
    with transaction.atomic(), planner_settings(enable_seqscan="off", enable_indexscan="off"):
        ids = list(queryset.order_by().values_list("pk", flat=True)[: SELECTIVE_SEARCH_LIMIT + 1])
    if len(ids) > SELECTIVE_SEARCH_LIMIT:
        return queryset
    return (queryset if unsearched is None else unsearched).filter(pk__in=ids)


@contextlib.contextmanager
def planner_settings(**values):
    """Set PostgreSQL settings for the current transaction and put them back on the way out.

    Inside transaction.atomic(): an error rolls the settings back with the savepoint; on success
    they are restored here, so an enclosing transaction (a test, a request) keeps its own.
    """
    with connection.cursor() as cur:
        names = list(values)
        cur.execute("SELECT " + ", ".join("current_setting(%s)" for _ in names), names)
        previous = cur.fetchone()
        for name, value in values.items():
            cur.execute("SELECT set_config(%s, %s, true)", [name, str(value)])
        yield
        for name, value in zip(names, previous, strict=True):
            cur.execute("SELECT set_config(%s, %s, true)", [name, value])
