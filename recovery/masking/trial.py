"""A masking rule tried on recent messages: does it match anything (the Masking page)."""

from django.conf import settings
from django.db.models import BinaryField, Q
from django.db.models.expressions import RawSQL

from recovery.access.teams import NOTHING
from recovery.bodies import DECODE_FIELDS
from recovery.masking.engine import compile_rule, is_withheld, masker_of
from recovery.models import Message, TeamScope
from recovery.models.decoders import readable

# How much of each sampled body the masking page tries a rule on.
SAMPLE_BODY_BYTES = 64 * 1024


def sample_matches(rules):
    """{rule id: (messages it masks something in, messages looked at)} over the newest
    MASK_RULE_SAMPLE messages each rule covers (a team's rule: in the team's scopes), the first
    SAMPLE_BODY_BYTES of each body: a rule that matches nothing shows as such."""
    by_team = {}
    for rule in rules:
        by_team.setdefault(rule.team_id, []).append(rule)
    found = {}
    for team_id, team_rules in by_team.items():
        where = Q()
        if team_id is not None:
            where = NOTHING
            for scope in TeamScope.objects.filter(team_id=team_id):
                where |= scope.q()
        sample = list(
            Message.objects.filter(where)
            .order_by("-collected_at")
            .only(*SAMPLED_FIELDS)
            .annotate(
                head=RawSQL("substring(body from 1 for %s)", [SAMPLE_BODY_BYTES], BinaryField())
            )[: settings.MASK_RULE_SAMPLE]
        )
        for message in sample:
            message.body = message.head
        for rule in team_rules:
            try:
                masker = masker_of([(rule.kind, compile_rule(rule.kind, rule.pattern))])
            except ValueError:
                found[rule.pk] = None  # the page says it cannot be applied
                continue
            hits = sum(1 for message in sample if _masks_something(masker, message))
            found[rule.pk] = (hits, len(sample))
    return found


SAMPLED_FIELDS = ("id", "headers", "body_size", *DECODE_FIELDS)


def _masks_something(masker, message):
    if masker.headers(message.headers) != message.headers:
        return True
    body = message.body_bytes
    shown = masker.body(body)
    if shown != body:
        # A JSON document cut at SAMPLE_BODY_BYTES is withheld for not parsing: that says
        # nothing of whether the rule matches the whole body.
        cut = (message.body_size or 0) > len(body)
        return not (cut and is_withheld(shown.decode("utf-8", "replace")))
    decoded = readable(message)
    if decoded is None:
        return False
    shown = masker.decoded(decoded)
    if decoded.value is not None:
        return shown.value != decoded.value
    return shown.text != decoded.text
