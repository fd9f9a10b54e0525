"""Forms of alert rules, notification channels and mutes."""

import json
from datetime import timedelta

from django import forms
from django.core.exceptions import ValidationError

from recovery.alerts.params import (
    FOR_SECONDS_MAX,
    MAX_DEPTH,
    MUTE_MINUTES_MAX,
    REMIND_SECONDS_MAX,
    params_problems,
    target_problems,
    vhost_problem,
)
from recovery.models import AlertRule, NotificationChannel


class AlertRuleForm(forms.ModelForm):
    """A rule: kind, its parameters (a JSON object; see docs/alerts.md), scope and channels."""

    params = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text='JSON object, e.g. {"threshold": 1000} (docs/alerts.md lists each kind\'s)',
    )
    remind_minutes = forms.IntegerField(
        required=False,
        min_value=1,
        max_value=REMIND_SECONDS_MAX // 60,
        label="Remind every (minutes)",
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
        # Only the channels this rule may notify are offered (its team's; global: global).
        self.fields["channels"].queryset = NotificationChannel.objects.filter(
            team_id=self.instance.team_id
        )
        self.fields["for_seconds"].min_value = 0
        self.fields["for_seconds"].max_value = FOR_SECONDS_MAX
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
        except RecursionError:
            raise ValidationError(f"nested deeper than {MAX_DEPTH} levels") from None
        except ValueError as exc:
            raise ValidationError(f"not JSON: {exc}") from exc
        if not isinstance(value, dict):
            raise ValidationError("must be a JSON object")
        return value

    def clean_vhost(self):
        vhost = self.cleaned_data.get("vhost") or ""
        problem = vhost_problem(vhost)
        if problem:
            raise ValidationError(problem)
        return vhost

    def clean(self):
        data = super().clean()
        if "params" in data and data.get("kind"):
            for problem in params_problems(data["kind"], data["params"]):
                self.add_error("params", problem)
        # A team's rule (made through the API) stays in the team's scope; every rule notifies
        # its own team's channels only (a global rule: global channels).
        fields = ("kind", "vhost", "queue", "exchange")
        rule = AlertRule(
            team_id=self.instance.team_id,
            **{name: data.get(name, getattr(self.instance, name)) for name in fields},
        )
        for field, problem in rule.team_problems(data.get("channels") or []).items():
            self.add_error(field if field in self.fields else None, problem)
        return data

    def clean_for_seconds(self):
        value = self.cleaned_data.get("for_seconds") or 0
        if not 0 <= value <= FOR_SECONDS_MAX:
            raise ValidationError(f"between 0 and {FOR_SECONDS_MAX} seconds")
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
        for problem in target_problems(kind, target):
            self.add_error("target", problem)
        data["target"] = target
        return data


class MuteForm(forms.Form):
    minutes = forms.IntegerField(min_value=0, max_value=MUTE_MINUTES_MAX, help_text="0 unmutes")
