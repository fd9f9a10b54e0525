"""Forms of users, their roles, and the activity log's filter."""

from django import forms
from django.contrib.auth import get_user_model, password_validation
from django.core.exceptions import ValidationError

from recovery.models import Role
from recovery.search.filters import UTCDateTimeField


class ActivityFilterForm(forms.Form):
    # What recovery.replay, recovery.replay.jobs, the job runner, the API and this console log.
    ACTIONS = [
        ("", "any"),
        ("replay", "replay"),
        ("edit_replay", "edit and replay"),
        ("discard", "discard"),
        ("restore", "restore"),
        ("job_created", "job created"),
        ("job_started", "job started"),
        ("job_canary_passed", "job canary passed"),
        ("job_paused", "job paused"),
        ("job_resumed", "job resumed"),
        ("job_cancelled", "job cancelled"),
        ("job_done", "job done"),
        ("job_failed", "job failed"),
        ("job_taken_over", "job taken over"),
        ("retention", "retention"),
        ("import_archive", "archive imported"),
        ("token_created", "API token created"),
        ("token_revoked", "API token revoked"),
        ("user_created", "user created"),
        ("role_changed", "role changed"),
        ("privileges_changed", "privileges changed"),
        ("user_deactivated", "user deactivated"),
        ("user_activated", "user activated"),
        ("login_refused", "sign-in refused"),
        ("sso_roles_changed", "roles changed at sign-in"),
        ("sso_linked", "account linked at sign-in"),
        ("sso_mapping_created", "sign-in mapping created"),
        ("sso_mapping_changed", "sign-in mapping changed"),
        ("sso_mapping_deleted", "sign-in mapping deleted"),
        ("body_view", "body viewed (detail, download, API, export)"),
        ("unmask", "break-glass unmask"),
        ("export", "export"),
        ("decoder_rule_created", "decoder rule created"),
        ("decoder_rule_changed", "decoder rule changed"),
        ("decoder_rule_deleted", "decoder rule deleted"),
        ("mask_rule_created", "masking rule created"),
        ("mask_rule_changed", "masking rule changed"),
        ("mask_rule_deleted", "masking rule deleted"),
    ]
    VIA = [("", "any"), ("console", "console"), ("api", "api"), ("system", "system")]

    user = forms.CharField(required=False, max_length=150)
    action = forms.CharField(
        required=False, max_length=32, widget=forms.TextInput(attrs={"list": "activity-actions"})
    )
    via = forms.ChoiceField(choices=VIA, required=False)
    message = forms.IntegerField(required=False, min_value=1, label="Message #")
    job = forms.IntegerField(required=False, min_value=1, label="Job #")
    since = UTCDateTimeField(required=False)
    until = UTCDateTimeField(required=False)

    def apply(self, queryset):
        data = self.cleaned_data
        lookups = {
            "user": "user__username",
            "action": "action",
            "via": "via",
            "message": "message_id",
            "job": "job_id",
            "since": "created_at__gte",
            "until": "created_at__lt",
        }
        for field, lookup in lookups.items():
            if data.get(field) not in (None, ""):
                queryset = queryset.filter(**{lookup: data[field]})
        return queryset


ROLE_CHOICES = [(r.value, r.label) for r in Role]


class UserCreateForm(forms.Form):
    username = forms.CharField(max_length=150)
    password = forms.CharField(widget=forms.PasswordInput, strip=False)
    role = forms.ChoiceField(choices=ROLE_CHOICES, initial=Role.VIEWER)

    def clean_username(self):
        name = self.cleaned_data["username"]
        field = get_user_model()._meta.get_field("username")
        for validator in field.validators:
            validator(name)
        if get_user_model().objects.filter(username__iexact=name).exists():
            raise ValidationError("A user with that name exists.")
        return name

    def clean(self):
        data = super().clean()
        if data.get("password"):
            user = get_user_model()(username=data.get("username", ""))
            password_validation.validate_password(data["password"], user)
        return data


class RoleForm(forms.Form):
    role = forms.ChoiceField(choices=ROLE_CHOICES)
