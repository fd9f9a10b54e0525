"""What one caller may see of one message: every masking rule compiled once (``MaskingRules``),
the view a caller gets of a message (``view_of``: masked, metadata-only, unmasked for a while),
and the body views written down as they are shown (docs/security.md, "Private data").

The engine that masks is ``recovery.masking.engine`` (no models); the rules and unmasks
themselves are models (``recovery.models.masking``)."""

import dataclasses
import logging
import types

from django.db.models import OuterRef, Subquery
from django.utils import timezone

from recovery.access.models import Activity, Privilege
from recovery.masking.engine import NO_MASKING, Masker
from recovery.models.decoders import readable
from recovery.models.masking import MaskingRules, Unmask

log = logging.getLogger(__name__)


@dataclasses.dataclass
class View:
    """What one caller may see of one message: whether its body at all (the ``bodies``
    privilege), and masked how (NO_MASKING while they hold an unexpired break-glass unmask)."""

    bodies: bool
    masker: Masker
    may_unmask: bool
    unmask: object = None  # the active recovery.models.Unmask

    @property
    def masked(self):
        return bool(self.masker)


def with_unmask(queryset, user):
    """``queryset`` of messages with ``active_unmask_id``: the user's unexpired unmask of each
    (an index probe in the same query, so ``view_of`` needs no query of its own)."""
    if user is None or not user.is_authenticated:
        return queryset
    active = Unmask.objects.filter(
        user=user, message_id=OuterRef("pk"), expires_at__gt=timezone.now()
    ).order_by("-expires_at")
    return queryset.annotate(active_unmask_id=Subquery(active.values("pk")[:1]))


def view_of(scope, user, message, rules=None):
    """The View of ``message`` for a caller (their Scope and user); ``rules``: loaded once.
    A message from ``with_unmask`` says whether it is unmasked; any other is looked up."""
    rules = MaskingRules.load() if rules is None else rules
    bodies = scope.may(Privilege.BODIES, message)
    masker = rules.masker_for(message)
    if masker and not changes_what_is_shown(masker, message, bodies):
        # Masked means a rule changed what is shown (#46): a message no rule reaches is plain,
        # editable by whoever may edit, with no unmask to ask for.
        masker = NO_MASKING
    may_unmask = bool(masker) and scope.may(Privilege.UNMASK, message)
    unmask = None
    if may_unmask:
        if not hasattr(message, "active_unmask_id"):
            unmask = Unmask.active(user, message.pk)
        elif message.active_unmask_id is not None:
            unmask = Unmask.objects.filter(pk=message.active_unmask_id).first()
    return View(
        bodies=bodies,
        masker=NO_MASKING if unmask is not None else masker,
        may_unmask=may_unmask,
        unmask=unmask,
    )


def changes_what_is_shown(masker, message, bodies=True):
    """Whether ``masker`` changes anything of ``message`` a caller sees: its headers, its group
    label, and (``bodies``) its body in every form (raw, decoded) and its edited copies'. One
    message's worth of the masking the page itself does (a detail page, not a list)."""
    if masker.headers(message.headers) != message.headers:
        return True
    if masker.label(message.group_label, message.headers) != message.group_label:
        return True
    if not bodies:
        return False
    if _changes_body(masker, message, message.body_bytes):
        return True
    from recovery.models.replay import MessageEdit

    for edit in MessageEdit.objects.filter(message_id=message.pk).only("headers", "body"):
        if edit.headers is not None and masker.headers(edit.headers) != edit.headers:
            return True
        if edit.body is not None and _changes_body(masker, message, bytes(edit.body)):
            return True
    return False


def _changes_body(masker, message, body):
    decoded = readable(message, body=body)
    if masker.stored(body, decoded) != body:
        return True
    if decoded is None:
        return False
    shown = masker.decoded(decoded)
    return (shown.value, shown.text, shown.data) != (decoded.value, decoded.text, decoded.data)


def log_body_view(user, message_id, via, how, unmasked=False, team=None):
    """A body was shown (console detail, download, API body or detail, export): who, which,
    when, how; the activity log's ``body_view`` rows."""
    Activity.record(
        user,
        "body_view",
        detail={"message": message_id, "how": how, "unmasked": unmasked},
        via=via,
        message=message_id,
        team=team,
    )


def log_body_views(user, shown, how, via="console", team=None):
    """``log_body_view`` for many bodies at once, one statement (a group page's previews):
    ``shown`` maps each message id to whether it was shown unmasked."""
    Activity.record_many(
        Activity.entry(
            user,
            "body_view",
            detail={"message": pk, "how": how, "unmasked": unmasked},
            via=via,
            message=pk,
            team=team,
        )
        for pk, unmasked in shown.items()
    )


def privacy_of(scope, rules=None):
    """``(vhost, queue, exchange) -> (masker, may read bodies)`` for rows that are not whole
    messages (a failure group's newest sample)."""
    rules = MaskingRules.load() if rules is None else rules

    def of(vhost, queue, exchange):
        row = types.SimpleNamespace(vhost=vhost, source_queue=queue, source_exchange=exchange)
        return rules.masker_for(row), scope.may(Privilege.BODIES, row)

    return of


def mask_for_display(rules, transitions=(), masking=None):
    """The rules' (and their ``transitions'``) free text as the console and the API show it:
    through the masking rules' regular expressions, as a notification's (a summary or an item
    can quote a failure group's label, a job's reason). In memory only: never save these
    objects afterwards. ``masking``: the loaded MaskingRules (loaded here if None)."""
    masking = MaskingRules.load() if masking is None else masking
    if not masking:
        return
    maskers = {}

    def masker_of(team_id):
        if team_id not in maskers:
            maskers[team_id] = masking.team_masker(team_id)
        return maskers[team_id]

    for rule in rules:
        masker = masker_of(rule.team_id)
        rule.last_summary = masker.free_text(rule.last_summary)
        rule.last_error = masker.free_text(rule.last_error)
        rule.last_items = [
            masker.free_text(item) if isinstance(item, str) else item
            for item in rule.last_items or []
        ]
    for transition in transitions:
        transition.summary = masker_of(transition.rule.team_id).free_text(transition.summary)
