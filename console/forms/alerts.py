"""Forms of alert rules, notification channels and mutes."""

import json
from datetime import timedelta

from django import forms
from django.core.exceptions import ValidationError
from django.core.validators import validate_email

from recovery.models import AlertRule, NotificationChannel


class AlertRuleForm(forms.ModelForm):
    """A rule: kind, its parameters (a JSON object; see docs/alerts.md), scope and channels."""

    params = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text='JSON object, e.g. {"threshold": 1000} (docs/alerts.md lists each kind\'s)',
    )
    remind_minutes = forms.IntegerField(
        required=False, min_value=1, max_value=7 * 24 * 60, label="Remind every (minutes)"
    )

    class Meta:
        model = AlertRule
        fields = [
            "name",
            "kind",
            "params",
            "vhost",
            "queue",
            "exchange",
            "group_key",
            "for_seconds",
            "channels",
            "enabled",
        ]
        widgets = {"channels": forms.CheckboxSelectMultiple}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["for_seconds"].min_value = 0
        self.fields["for_seconds"].max_value = 7 * 24 * 3600
        if self.instance.pk:
            self.initial["params"] = json.dumps(self.instance.params)
            if self.instance.remind_every:
                self.initial["remind_minutes"] = int(
                    self.instance.remind_every.total_seconds() // 60
                )

    def clean_params(self):
        raw = self.cleaned_data.get("params") or "{}"
        try:
            value = json.loads(raw)
        except ValueError as exc:
            raise ValidationError(f"not JSON: {exc}") from exc
        if not isinstance(value, dict):
            raise ValidationError("must be a JSON object")
        return value

    def clean_for_seconds(self):
        value = self.cleaned_data.get("for_seconds") or 0
        if not 0 <= value <= 7 * 24 * 3600:
            raise ValidationError("between 0 and 604800 seconds")
        return value

    def save(self, commit=True):
        rule = super().save(commit=False)
        minutes = self.cleaned_data.get("remind_minutes")
        rule.remind_every = timedelta(minutes=minutes) if minutes else None
        if commit:
            rule.save()
            self.save_m2m()
        return rule


class NotificationChannelForm(forms.ModelForm):
    class Meta:
        model = NotificationChannel
        fields = ["name", "kind", "target", "enabled"]
        widgets = {"target": forms.TextInput(attrs={"size": 60})}

    def clean(self):
        data = super().clean()
        kind, target = data.get("kind"), (data.get("target") or "").strip()
        if kind in ("webhook", "slack") and not target.startswith(("http://", "https://")):
            self.add_error("target", "an http:// or https:// URL")
        if kind == "email":
            addresses = [a.strip() for a in target.split(",") if a.strip()]
            if not addresses:
                self.add_error("target", "one or more email addresses, comma-separated")
            for address in addresses:
                try:
                    validate_email(address)
                except ValidationError:
                    self.add_error("target", f"not an email address: {address}")
        data["target"] = target
        return data


class MuteForm(forms.Form):
    minutes = forms.IntegerField(min_value=0, max_value=30 * 24 * 60, help_text="0 unmutes")
