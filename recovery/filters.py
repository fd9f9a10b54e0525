"""The one message filter, shared by the console list, the API and bulk replay jobs."""

from django import forms
from django.db.models import Q

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


def search_q(text):
    """Exact ids first (indexed); header values as a JSON containment match (GIN-indexed)."""
    return Q(message_id=text) | Q(correlation_id=text) | Q(group_key=text)
