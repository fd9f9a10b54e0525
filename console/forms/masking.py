"""The masking rule form (admins): a bad regular expression or JSON path is a field error."""

from django import forms

from recovery.models import MaskRule, Team


class MaskRuleForm(forms.ModelForm):
    team = forms.ModelChoiceField(
        queryset=Team.objects.all(),
        required=False,
        empty_label="every message (global)",
        help_text="A team's rule masks the messages in that team's scopes.",
    )

    class Meta:
        model = MaskRule
        fields = ["team", "kind", "pattern", "note"]
        help_texts = {
            "pattern": "A header name (any case); a JSON path: $.card.number, $.items[*].email, "
            "$..email (any depth); or a regular expression over text bodies.",
        }
