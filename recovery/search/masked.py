"""Free-text search over masked messages: found by what a viewer is shown, never by what the
mask hides (docs/security.md, "Search and masking").

The search index holds the stored text. Searched as it is, a masked field answers "is there a
message whose card number starts with 41?": extended a character at a time, ``stats?q=
"number": "41`` recovered a card number in 97 requests. So a message a masking rule covers
matches a substring search only where its masked rendering holds the term: the index finds
candidates by the stored text (a superset), and each candidate's masked document (ids,
masked headers, masked body, as the detail page shows them) is checked in Python.

Masking rules apply to whoever looks (``recovery.models.masking``), so every caller's search
goes through here; a break-glass unmask lifts the mask on the page for a while, not in the
search. The check is bounded: at most MASKED_CHECK_LIMIT candidates, the newest, per search.
"""

import json

from django.db.models import Q

from recovery.access.teams import NOTHING
from recovery.models import DecoderRule
from recovery.models.decoders import readable
from recovery.models.masking import MaskingRules

# Candidates (masked messages whose stored text holds the term) checked per search; a term
# more common than this among masked messages is checked on the newest ones only.
MASKED_CHECK_LIMIT = 1000
DOCUMENT_CHARS = 8192
FIELDS = (
    "id",
    "vhost",
    "source_queue",
    "source_exchange",
    "message_id",
    "correlation_id",
    "headers",
    "body",
    "content_type",
    "content_encoding",
    "properties",
)


def masked_q(rules=None):
    """The messages some masking rule covers: every one under a global rule, else those in
    the scopes of the teams that have rules; NOTHING without rules."""
    rules = MaskingRules.load() if rules is None else rules
    if rules.global_rules:
        return Q()
    covered = NOTHING
    for scopes, _team_rules in rules.team_rules.values():
        for scope in scopes:
            covered |= scope.q()
    return covered


def masked_document(message, masker, decoders):
    """What a viewer may read of ``message`` as one text: ids, masked headers, masked body."""
    headers = masker.free_text(json.dumps(masker.headers(message.headers), ensure_ascii=False))
    decoded = readable(message, decoders)
    if decoded is not None:
        body = masker.decoded(decoded).text or ""
    else:
        # The whole body is masked before it is cut: a JSON path needs the whole document.
        body = masker.body(message.body_bytes).decode("utf-8", "replace")
    body = body[:DOCUMENT_CHARS]
    return " ".join((message.message_id, message.correlation_id, headers, body))


def matching_ids(text, candidates):
    """Of ``candidates`` (a queryset of masked messages the stored text matched), the ids of
    those whose masked document holds ``text`` (case-insensitively), the newest first."""
    rules = MaskingRules.load()
    decoders = list(DecoderRule.objects.all())
    wanted = text.lower()
    rows = candidates.order_by("-id").only(*FIELDS)[:MASKED_CHECK_LIMIT]
    found = []
    for message in rows:
        masker = rules.masker_for(message)
        if wanted in masked_document(message, masker, decoders).lower():
            found.append(message.pk)
    return found
