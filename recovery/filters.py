"""The one message filter, shared by the console list, the API and bulk replay jobs."""

from django import forms
from django.db.models import BooleanField, Q
from django.db.models.expressions import RawSQL

from recovery.models import Kind, Message, Reason, Status


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
    since = forms.DateTimeField(required=False)
    until = forms.DateTimeField(required=False)
    q = forms.CharField(required=False, max_length=500, label="Search")

    def filter_dict(self):
        """The cleaned, non-empty filters as JSON-safe values (stored on replay jobs)."""
        data = {k: v for k, v in self.cleaned_data.items() if v not in (None, "")}
        for key in ("since", "until"):
            if key in data:
                data[key] = data[key].isoformat()
        return data

    def apply(self, queryset=None):
        queryset = Message.objects.all() if queryset is None else queryset
        return apply_filters(queryset, self.cleaned_data)


def apply_filters(queryset, data):
    lookups = {
        "kind": "kind",
        "queue": "source_queue",
        "exchange": "source_exchange",
        "reason": "reason",
        "status": "status",
        "vhost": "vhost",
        "group": "group_key",
        "since": "collected_at__gte",
        "until": "collected_at__lt",
    }
    for field, lookup in lookups.items():
        value = data.get(field)
        if value not in (None, ""):
            queryset = queryset.filter(**{lookup: value})
    q = (data.get("q") or "").strip()
    if q:
        queryset = queryset.filter(search_q(q))
    return queryset


# What a free-text search looks in: ids, the headers as JSON text and the body bytes as text, each
# cut at 8 KiB. It is the expression of the trigram index msg_search_trgm (migration 0004); the two
# must stay identical or a search scans the whole store.
SEARCH_DOCUMENT_SQL = (
    "(message_id || ' ' || correlation_id || ' ' || left(headers::text, 8192) || ' ' || "
    "encode(substring(body from 1 for 8192), 'escape'))"
)
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


def search_q(text):
    """Exact ids and group key (b-tree indexed), and a substring of ids, header values or body.

    The substring part is case-insensitive and uses the trigram index; it needs at least
    MIN_SUBSTRING_LENGTH characters.
    """
    q = Q(message_id=text) | Q(correlation_id=text) | Q(group_key=text)
    if len(text) >= MIN_SUBSTRING_LENGTH:
        # Headers hold non-ASCII text as such, bodies as octal escapes: try both spellings.
        for pattern in sorted({like_contains(text), like_contains(bytea_escape(text))}):
            q |= Q(
                RawSQL(f"{SEARCH_DOCUMENT_SQL} ILIKE %s", [pattern], output_field=BooleanField())
            )
    return q
