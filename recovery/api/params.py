"""Query parameters validated exactly as the schema states them.

A parameter the schema calls a date-time must be one (RFC 3339, with an offset), a boolean must
be ``true`` or ``false``: clients get a 400 naming the parameter instead of a guess. The message
filters are the shared ``MessageFilterForm``'s fields, translated to these strict fields, and
applied with the same ``apply_filters`` as the console and replay jobs.
"""

import re

from django import forms
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from recovery.search.filters import MessageFilterForm

RFC3339 = re.compile(
    r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})$", re.ASCII
)
ISO_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$", re.ASCII)


class Rfc3339DateTimeField(serializers.DateTimeField):
    default_error_messages = {
        "rfc3339": "Use an RFC 3339 date-time with an offset, e.g. 2026-11-20T00:00:00Z."
    }

    def to_internal_value(self, value):
        if not isinstance(value, str) or not RFC3339.match(value):
            self.fail("rfc3339")
        return super().to_internal_value(value.upper())


class IsoDateField(serializers.DateField):
    default_error_messages = {"iso": "Use a date as YYYY-MM-DD."}

    def to_internal_value(self, value):
        if not isinstance(value, str) or not ISO_DATE.match(value):
            self.fail("iso")
        return super().to_internal_value(value)


@extend_schema_field({"type": "boolean"})
class StrictBooleanField(serializers.Field):
    default_error_messages = {"invalid": "Use true or false."}

    def to_internal_value(self, value):
        if value == "true" or value is True:
            return True
        if value == "false" or value is False:
            return False
        self.fail("invalid")

    def to_representation(self, value):
        return value


# JSON bodies are typed as the schema says: DRF alone would take "5" for an integer, 5 for a
# string and false for a number.
class StrictCharField(serializers.CharField):
    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictIntegerField(serializers.IntegerField):
    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictFloatField(serializers.FloatField):
    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int | float):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictIntegerChoiceField(serializers.ChoiceField):
    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid_choice", input=data)
        return super().to_internal_value(data)


DESCRIPTIONS = {
    "kind": "how it was lost",
    "queue": "queue the message died in",
    "exchange": "exchange it was published to",
    "vhost": "virtual host",
    "group": "failure-group key (see `groups`)",
    "since": "collected at or after",
    "until": "collected before",
    "q": "search: message_id, correlation_id, header values and body text (3+ characters "
    "for a substring match)",
}


def _strict_field(name, field):
    common = {"required": False, "help_text": DESCRIPTIONS.get(name, "")}
    if isinstance(field, forms.ChoiceField):
        # The form's "" ("any") is left out: an API client omits the parameter instead.
        return serializers.ChoiceField(choices=[c for c in field.choices if c[0]], **common)
    if isinstance(field, forms.DateTimeField):
        return Rfc3339DateTimeField(**common)
    return StrictCharField(
        max_length=field.max_length, allow_blank=True, trim_whitespace=False, **common
    )


MessageFilterParams = type(
    "MessageFilterParams",
    (serializers.Serializer,),
    {name: _strict_field(name, field) for name, field in MessageFilterForm.base_fields.items()},
)
MessageFilterParams.__doc__ = "The message filters of recovery.search.filters, as query parameters."


def validated(params_serializer, query_params):
    """Validated query parameters (a 400 naming each bad one otherwise)."""
    # A plain dict, not the QueryDict: DRF reads an empty HTML-form value as "not given", so
    # `?until=` would pass silently; here it is refused like any other malformed value.
    params = params_serializer(data=query_params.dict())
    params.is_valid(raise_exception=True)
    return params.validated_data
