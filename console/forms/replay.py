"""Forms of replays: one message (target, edit, discard), a selection of messages, a bulk job."""

import json

from django import forms
from django.conf import settings
from django.core.exceptions import ValidationError

from console.forms.paging import BIGINT_MAX
from recovery.bodies import DecodeError
from recovery.broker.codec import json_headers_problem
from recovery.replay import options as job_options
from recovery.search.filters import MessageFilterForm

MAX_BULK_IDS = 1000


def delay_choices():
    from recovery.replay.targets import delay_label

    return [("", "now")] + [(str(d), f"in {delay_label(d)}") for d in settings.REPLAY_DELAYS]


class TargetForm(forms.Form):
    """Where a replay goes: the default, a queue, or an exchange + routing key; now or later.

    All blank means the message's default target (docs/design.md "Replay semantics"). The engine
    validates again (recovery.replay.targets.validate_target) and its errors are shown as well.
    """

    queue = forms.CharField(
        required=False,
        max_length=255,
        help_text="Publish to this queue through the default exchange.",
    )
    exchange = forms.CharField(required=False, max_length=255)
    routing_key = forms.CharField(required=False, max_length=255, label="Routing key")
    delay_seconds = forms.TypedChoiceField(
        required=False, coerce=int, empty_value=None, label="When"
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["delay_seconds"].choices = delay_choices()

    def clean(self):
        data = super().clean()
        target = self.target()
        if job_options.names_queue_and_exchange(
            target["queue"], target["exchange"], target["routing_key"]
        ):
            raise ValidationError(job_options.QUEUE_OR_EXCHANGE)
        return data

    def target(self):
        """Keyword arguments for replay_message / edit_and_replay (None = the default)."""
        data = self.cleaned_data
        exchange, key = data.get("exchange") or None, data.get("routing_key") or None
        if exchange is not None and key is None:
            key = ""  # a fanout ignores the key; any other exchange then gets the empty key
        return {
            "queue": data.get("queue") or None,
            "exchange": exchange,
            "routing_key": key,
            "delay_seconds": data.get("delay_seconds"),
        }


class DiscardForm(forms.Form):
    reason = forms.CharField(
        required=False, max_length=500, widget=forms.TextInput(attrs={"placeholder": "why"})
    )


class EditReplayForm(TargetForm):
    """Edit headers (tagged JSON, recovery.client.headers) and a text body, then replay once."""

    headers = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 12, "spellcheck": "false"}),
        required=False,
        help_text='Tagged JSON as stored: {"name": value}; typed values keep their "$t" tag.',
    )
    body = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 14, "spellcheck": "false"}),
        required=False,
        strip=False,
    )

    def __init__(self, *args, body_editable=True, decoded=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.body_editable = body_editable or decoded is not None
        # The decoded form (recovery.bodies) is edited as JSON and encoded back through the same
        # chain; a value that does not fit the schema is this field's error.
        self.decoded = decoded
        if decoded is not None:
            self.fields[
                "body"
            ].help_text = (
                f"Decoded ({decoded.label}): the edit is encoded back through the same chain."
            )
        elif not body_editable:
            self.fields["body"].disabled = True
            self.fields["body"].help_text = "The body is not UTF-8 text; it is replayed as is."

    def clean_body(self):
        body = self.cleaned_data["body"]
        if self.decoded is None:
            return body
        try:
            value = json.loads(body)
        except ValueError as exc:
            raise ValidationError(f"The decoded form must stay JSON: {exc}") from None
        except RecursionError:
            raise ValidationError("Not valid JSON: nested too deep.") from None
        try:
            self.encoded = self.decoded.encode(value)
        except DecodeError as exc:
            raise ValidationError(f"Cannot encode it back: {exc}") from None
        return body

    def clean_headers(self):
        raw = self.cleaned_data["headers"].strip()
        if not raw:
            return {}
        try:
            value = json.loads(raw)
        except ValueError as exc:
            raise ValidationError(f"Not valid JSON: {exc}") from None
        except RecursionError:
            raise ValidationError("Not valid JSON: nested too deep.") from None
        if not isinstance(value, dict):
            raise ValidationError("Headers must be a JSON object.")
        # The API's rule (recovery.api.serializers): what cannot go on the wire is refused here.
        problem = json_headers_problem(value)
        if problem is not None:
            raise ValidationError(f"Not a valid header table: {problem}")
        return value

    def body_bytes(self):
        if self.decoded is not None:
            return self.encoded
        if not self.body_editable:
            return None
        return self.cleaned_data["body"].encode("utf-8")


class BulkActionForm(forms.Form):
    ACTIONS = [
        ("replay", "Replay"),
        ("discard", "Discard"),
        ("job", "New job"),
        ("compare", "Compare"),
    ]

    action = forms.ChoiceField(choices=ACTIONS)
    ids = forms.CharField()
    reason = forms.CharField(required=False, max_length=500)

    def __init__(self, data=None, **kwargs):
        # Checkboxes send ids=1&ids=2; keep them as one comma-separated value for the field.
        if data is not None and hasattr(data, "getlist"):
            data = data.copy()
            data["ids"] = ",".join(data.getlist("ids"))
        super().__init__(data, **kwargs)

    def clean_ids(self):
        ids = message_ids(self.cleaned_data["ids"], limit=MAX_BULK_IDS)
        if not ids:
            raise ValidationError("Select at least one message.")
        return ids

    def clean(self):
        data = super().clean()
        if data.get("action") == "compare" and len(data.get("ids") or ()) != 2:
            raise ValidationError("Compare needs exactly two selected messages.")
        return data


def message_ids(text, **limits):
    """``split_message_ids``, each id first checked to be ASCII digits of a bigint: int() takes
    ``²`` nowhere and more than 4,300 digits with a ValueError (a 500)."""
    for part in text.split(","):
        part = part.strip()
        digits = part.isascii() and part.isdigit() and len(part) <= len(str(BIGINT_MAX))
        if part and not (digits and int(part) <= BIGINT_MAX):
            raise ValidationError(f"Not a message id: {part[:40]!r}.")
    return job_options.split_message_ids(text, **limits)


def option_field(option):
    """The form field of a numeric job option (recovery.replay.options): its limits, its label."""
    field_class = forms.IntegerField if option.whole else forms.FloatField
    if option.above_minimum:  # no HTML min: the minimum itself is refused
        return field_class(
            required=False,
            max_value=option.maximum,
            validators=option.validators()[:1],
            label=option.label,
        )
    return field_class(
        required=False, min_value=option.minimum, max_value=option.maximum, label=option.label
    )


class JobForm(MessageFilterForm):
    """A replay job: which messages (filter, ids or failure group), where, and how fast."""

    ids = forms.CharField(required=False, widget=forms.HiddenInput)
    target_exchange = forms.CharField(required=False, max_length=255, label="Exchange")
    target_routing_key = forms.CharField(required=False, max_length=255, label="Routing key")
    target_queue = forms.CharField(required=False, max_length=255, label="Queue")
    delay_seconds = forms.TypedChoiceField(
        required=False, coerce=int, empty_value=None, label="When"
    )
    rate = option_field(job_options.RATE)
    include_poisoned = forms.BooleanField(required=False, label="Include poisoned")
    canary_size = option_field(job_options.CANARY_SIZE)
    canary_pause_seconds = option_field(job_options.CANARY_PAUSE_SECONDS)
    canary_max_failure_pct = option_field(job_options.CANARY_MAX_FAILURE_PCT)
    breaker_threshold_pct = option_field(job_options.BREAKER_THRESHOLD_PCT)

    FILTER_FIELDS = list(MessageFilterForm.base_fields)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["delay_seconds"].choices = delay_choices()

    TARGET_FIELDS = ["target_exchange", "target_routing_key", "target_queue", "delay_seconds"]
    PACE_FIELDS = [
        "rate",
        "include_poisoned",
        "canary_size",
        "canary_pause_seconds",
        "canary_max_failure_pct",
        "breaker_threshold_pct",
    ]

    def clean_ids(self):
        return message_ids(self.cleaned_data["ids"])

    def clean(self):
        data = super().clean()
        target = {name: data.get(name) or None for name in self.TARGET_FIELDS}
        if job_options.names_queue_and_exchange(
            target["target_queue"], target["target_exchange"], target["target_routing_key"]
        ):
            self.add_error("target_queue", job_options.QUEUE_OR_EXCHANGE)  # as the engine does
        if not data.get("ids") and not self.filter_dict():
            raise ValidationError(
                "A job needs a filter, a failure group or selected messages; "
                "replaying the whole store by accident is not an option."
            )
        return data

    def selection(self):
        """The keyword arguments naming which messages (for create_job and dry_run)."""
        data = self.cleaned_data
        if data.get("ids"):
            return {"message_ids": data["ids"]}
        filters = self.filter_dict()
        group = filters.pop("group", None)
        if group and not filters:
            return {"group_key": group}
        if group:
            filters["group"] = group
        return {"filters": filters}

    def options(self):
        data = self.cleaned_data
        options = {}
        for name in self.TARGET_FIELDS + self.PACE_FIELDS:
            value = data.get(name)
            if value not in (None, ""):
                options[name] = value
        options["include_poisoned"] = bool(data.get("include_poisoned"))
        return options

    def filter_dict(self):
        data = {
            k: v
            for k, v in self.cleaned_data.items()
            if k in self.FILTER_FIELDS and v not in (None, "")
        }
        for key in ("since", "until"):
            if key in data:
                data[key] = data[key].isoformat()
        return data


# The engine names its fields after its own arguments; show them on the matching form field.
ENGINE_FIELD_NAMES = {
    "target_exchange": "exchange",
    "target_routing_key": "routing_key",
    "target_queue": "queue",
    "headers_json": "headers",
}


def add_engine_errors(form, error):
    """Put a ValidationError raised by recovery.replay.jobs / recovery.replay onto ``form``."""
    if not hasattr(error, "error_dict"):
        form.add_error(None, error.messages)
        return
    for name, messages in error.message_dict.items():
        field = name if name in form.fields else ENGINE_FIELD_NAMES.get(name)
        if field not in form.fields:
            field, messages = None, [f"{name}: {m}" for m in messages]
        form.add_error(field, messages)
