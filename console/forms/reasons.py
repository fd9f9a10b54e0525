"""A free-text reason a console action records (a discard, a break-glass unmask).

Read through a form, never ``request.POST`` itself: Django's CharField refuses NUL bytes
(ProhibitNullCharactersValidator), which PostgreSQL refuses in text (a 500 otherwise).
"""

from django import forms


class ReasonForm(forms.Form):
    reason = forms.CharField(required=False)

    def error_text(self):
        return "; ".join(f"{name}: {' '.join(errors)}" for name, errors in self.errors.items())
