"""The anchor of a keyset page (``?before=<id>``, ``?after=<id>``), as a form field.

Every keyset page reads its anchor through ``AnchorForm``, never ``request.GET`` itself: an id
is ASCII digits naming a positive bigint, so ``²`` (which passes ``str.isdigit()`` and fails
``int()``), 4,301 digits (past Python's int-string limit) and 20 digits (past PostgreSQL's
bigint) are a form error, not a 500.
"""

from django import forms
from django.core.exceptions import ValidationError

BIGINT_MAX = 2**63 - 1


class AnchorField(forms.IntegerField):
    """A row id: a whole number from 1 to PostgreSQL's bigint maximum, in ASCII digits."""

    default_error_messages = {"invalid": "A row id: a whole number in ASCII digits."}

    def __init__(self, **kwargs):
        kwargs.setdefault("required", False)
        super().__init__(min_value=1, max_value=BIGINT_MAX, widget=forms.HiddenInput, **kwargs)

    def to_python(self, value):
        if value in self.empty_values:
            return None
        text = str(value)
        # Checked before int() is called: int() takes other scripts' digits, signs, spaces and
        # underscores, and refuses (with a ValueError) more than 4,300 digits.
        if not (text.isascii() and text.isdigit()) or len(text) > len(str(BIGINT_MAX)):
            raise ValidationError(self.error_messages["invalid"], code="invalid")
        return int(text)


class AnchorForm(forms.Form):
    before = AnchorField()
    after = AnchorField()


def anchor_of(request, name="before"):
    """The request's anchor ``name`` as an int, or None when it is absent or malformed: a page
    asked for with a malformed anchor is the first page, as with an id that names no row."""
    form = AnchorForm(request.GET)
    form.is_valid()  # a field that fails is left out of cleaned_data: no anchor
    return form.cleaned_data.get(name)
