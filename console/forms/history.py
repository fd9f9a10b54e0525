"""The message history's filters (console/views/history.py)."""

from django import forms

from recovery.models import HistoryAction


class HistoryFilterForm(forms.Form):
    message_id = forms.CharField(required=False, max_length=255, label="Message id")
    action = forms.ChoiceField(choices=[("", "any")] + list(HistoryAction.choices), required=False)

    def apply(self, queryset):
        data = self.cleaned_data
        if data.get("message_id"):
            queryset = queryset.filter(message_id=data["message_id"])
        if data.get("action"):
            queryset = queryset.filter(action=data["action"])
        return queryset
