"""The filter of an audit run's evidence."""

from django import forms

from recovery.models.audit import EVIDENCE_KINDS
from recovery.search.filters import UTCDateTimeField


class EvidenceFilterForm(forms.Form):
    KINDS = [("", "any")] + [(kind, kind.replace("_", " ")) for kind in EVIDENCE_KINDS]
    kind = forms.CharField(required=False, max_length=32, widget=forms.Select(choices=KINDS))
    window = UTCDateTimeField(required=False, label="Window start")
    exchange = forms.CharField(required=False, max_length=255)
    consumer_group = forms.CharField(required=False, max_length=255, label="Consumer group")
    message_id = forms.CharField(required=False, max_length=255)

    def apply(self, queryset):
        data = self.cleaned_data
        lookups = {
            "kind": "kind",
            "window": "window_start",
            "exchange": "exchange",
            "consumer_group": "consumer_group",
            "message_id": "message_id",
        }
        for field, lookup in lookups.items():
            if data.get(field) not in (None, ""):
                queryset = queryset.filter(**{lookup: data[field]})
        return queryset
