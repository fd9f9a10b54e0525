"""Export: the messages a filter matches, as JSON Lines with base64 bodies, masked as the
exporting caller sees them (docs/security.md, "Private data").

Exporting is a privilege of its own (recovery.models.Privilege.EXPORT). Every export is logged:
one ``export`` activity row (the filter, how many) and a ``body_view`` row per message whose
body it carries, before the first line is sent.
"""

import base64
import json

from django.conf import settings
from django.core.exceptions import PermissionDenied, ValidationError

from recovery.models import Activity, DecoderRule, Message, Privilege
from recovery.models.decoders import readable as decoded_form
from recovery.models.masking import MaskingRules
from recovery.search.filters import apply_filters

# Messages read from the store per query while streaming.
CHUNK = 200
# The fields a line copies as stored (the export line is its own format, not the API's message);
# headers and body are masked, so they are written apart.
PLAIN = (
    "id",
    "kind",
    "vhost",
    "source_queue",
    "source_exchange",
    "routing_keys",
    "reason",
    "status",
    "message_id",
    "correlation_id",
    "content_type",
    "content_encoding",
    "properties",
)
FIELDS = (*PLAIN, "collected_at", "headers", "body")


def prepare_export(scope, user, filters, via):
    """The ids to export (newest first), logged; PermissionDenied without the export
    privilege, ValidationError past EXPORT_MAX_MESSAGES (the message says how many matched)."""
    if not scope.may(Privilege.EXPORT):
        raise PermissionDenied("exporting needs the export privilege")
    limit = settings.EXPORT_MAX_MESSAGES
    matching = scope.messages(apply_filters(Message.objects.all(), filters, scope))
    matching = matching.filter(scope.privilege_q(Privilege.EXPORT))
    rows = list(
        matching.order_by("-collected_at", "-id").values_list(
            "id", "vhost", "source_queue", "source_exchange"
        )[: limit + 1]
    )
    if len(rows) > limit:
        raise ValidationError(
            f"more than {limit} messages match (EXPORT_MAX_MESSAGES): narrow the filter"
        )
    readable = [pk for pk, *where in rows if scope.may(Privilege.BODIES, _Where(*where))]
    Activity.record(
        user,
        "export",
        detail={"filters": _jsonable(filters), "messages": len(rows), "bodies": len(readable)},
        via=via,
        team=scope.acting_team,
    )
    Activity.record_many(
        Activity.entry(
            user,
            "body_view",
            detail={"message": pk, "how": "export", "unmasked": False},
            via=via,
            message=pk,
            team=scope.acting_team,
        )
        for pk in readable
    )
    return [pk for pk, *_ in rows], set(readable)


class _Where:
    def __init__(self, vhost, source_queue, source_exchange):
        self.vhost, self.source_queue, self.source_exchange = vhost, source_queue, source_exchange


def _jsonable(filters):
    return {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in filters.items() if v}


def export_lines(ids, readable):
    """One JSON line per message, in ``ids`` order: bodies (of ``readable`` ids) and headers
    masked; break-glass unmasks do not apply to exports."""
    rules = MaskingRules.load()
    decoders = list(DecoderRule.objects.all())
    for start in range(0, len(ids), CHUNK):
        chunk = ids[start : start + CHUNK]
        messages = Message.objects.only(*FIELDS).in_bulk(chunk)
        for pk in chunk:
            message = messages.get(pk)
            if message is None:  # deleted (retention) since the export began
                continue
            masker = rules.masker_for(message)
            stored = decoded_form(message, decoders) if masker and pk in readable else None
            yield json.dumps(_line(message, masker, pk in readable, stored)) + "\n"


def _line(message, masker, with_body, stored):
    body = masker.stored(message.body_bytes, stored) if with_body else None
    return {
        **{name: getattr(message, name) for name in PLAIN},
        "collected_at": message.collected_at.isoformat(),
        "headers": masker.headers(message.headers),
        "masked": bool(masker),
        "body_base64": None if body is None else base64.b64encode(body).decode("ascii"),
        "body_withheld": None if with_body else "metadata only",
    }
