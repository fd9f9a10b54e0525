"""What a failure group shows on the pages and in the API: its label, kind, source, first and
last collection time, and its newest body's sample line, as the caller may see them (masked
by their rules, decoded as the message's own page decodes it)."""

import dataclasses
import json

from django.db import connection

from recovery.client import headers as header_codec
from recovery.dead_letters import exception_type
from recovery.models import DecoderRule
from recovery.models.decoders import readable


def group_details(keys, where=("true", ()), privacy=None, samples=True):
    """Label, kind, source and exact first/last collection time per group (index probes);
    ``where``: (SQL, params) over recovery_message, a caller's scope (``Scope.where_sql``);
    ``privacy``: ``(vhost, queue, exchange) -> (masker, may read bodies)`` for the caller
    (recovery.masking): the exception header and the sample line are shown as they may see
    them. None: unmasked (the system's own use). ``samples`` False: no sample line (labels
    only: no body is decoded or masked)."""
    if not keys:
        return {}
    where_sql, where_params = where
    with connection.cursor() as cur:
        cur.execute(
            f"""
            SELECT g.key, newest.group_label, newest.kind, newest.reason, newest.source_queue,
                   newest.source_exchange, newest.collected_at,
                   (SELECT recovery_message.collected_at FROM recovery_message
                    WHERE recovery_message.group_key = g.key AND ({where_sql})
                    ORDER BY recovery_message.collected_at, recovery_message.id LIMIT 1),
                   newest.headers, newest.sample, newest.vhost, newest.id, newest.body_size,
                   newest.content_type, newest.content_encoding, newest.properties
            FROM unnest(%s::text[]) AS g(key)
            CROSS JOIN LATERAL (
                SELECT group_label, kind, reason, source_queue, source_exchange, collected_at,
                       headers, substring(body from 1 for %s) AS sample, vhost, id, body_size,
                       content_type, content_encoding, properties
                FROM recovery_message WHERE recovery_message.group_key = g.key AND ({where_sql})
                ORDER BY recovery_message.collected_at DESC, recovery_message.id DESC LIMIT 1
            ) AS newest
            """,
            [*where_params, list(keys), SAMPLE_BYTES, *where_params],
        )
        details = {}
        decoders = []  # loaded once, at the first masked sample
        for row in cur.fetchall():
            details[row[0]] = _group_detail(row, privacy, samples, decoders)
        return details


DETAIL_COLUMNS = ["key", "label", "kind", "reason", "queue", "exchange", "last", "first"]


def _group_detail(row, privacy, samples, decoders):
    detail = dict(zip(DETAIL_COLUMNS, row[:8], strict=True))
    # A raw cursor gives jsonb as its text (Django decodes it in the field, not here).
    headers = _jsonb(row[8]) or {}
    masker, bodies = privacy(row[10], row[4], row[5]) if privacy else (None, True)
    if masker is not None:
        detail["label"] = masker.label(detail["label"], headers)
        headers = masker.headers(headers)
    detail["exception"] = exception_type(header_codec.headers_from_json(headers))
    if not samples:
        return detail
    if masker and not decoders:
        decoders.append(_decoder_rules())
    # The message the sample is read from, and how (the group page logs a body view).
    detail["sample_id"] = row[11]
    detail["sample_read"], detail["sample_masked"] = bodies, bool(masker)
    sample = SampleOf(
        vhost=row[10],
        source_queue=row[4],
        source_exchange=row[5],
        content_type=row[13],
        content_encoding=row[14],
        properties=_jsonb(row[15]) or {},
        body_size=row[12],
        preview=bytes(row[9] or b""),
    )
    detail["sample"] = shown_sample(sample, masker, bodies, decoders[0] if decoders else None)
    return detail


def _jsonb(value):
    return json.loads(value) if isinstance(value, str) else value


def _decoder_rules():
    return list(DecoderRule.objects.all())


@dataclasses.dataclass
class SampleOf:
    """What a sample line is read from: the first SAMPLE_BYTES of a body (``preview``), and
    what says how the body decodes (recovery.bodies.DECODE_FIELDS)."""

    vhost: str
    source_queue: str
    source_exchange: str
    content_type: str
    content_encoding: str
    properties: dict
    body_size: int | None
    preview: bytes


# How much of a group's newest body its sample line is read from.
SAMPLE_BYTES = 400


MASKED_SAMPLE = "(masked: open a message to see its body)"


def shown_sample(message, masker, bodies, decoders=None):
    """A body's sample line as a caller may see it. ``message``: a SampleOf, or a Message with
    its first SAMPLE_BYTES as ``preview`` and the DECODE_FIELDS loaded; ``decoders``: the
    DecoderRules, loaded once for a page (None: read here).

    Masked, the sample goes through the decoder chain the message's own page uses (base64,
    gzip, protobuf, Avro...: masking its stored bytes would show what the rules hide, as it is
    once the layers are undone) and is masked decoded. A sample that is not the whole body
    cannot be decoded or parsed as the rules need it (a cut document): it is not shown."""
    if not bodies:
        return "(metadata only: no body)"
    sample = bytes(message.preview or b"")
    if not masker:
        return sample_line(sample)
    size = message.body_size
    whole = len(sample) >= size if size is not None else len(sample) < SAMPLE_BYTES
    decoded = readable(message, decoders, body=sample)
    if decoded is not None:
        return _decoded_sample(masker, decoded) if whole else MASKED_SAMPLE
    if masker.paths and not whole:
        return MASKED_SAMPLE
    return sample_line(masker.body(sample))


def _decoded_sample(masker, decoded):
    if decoded.error is not None:
        return MASKED_SAMPLE  # what the rules would reach in it cannot be found
    shown = masker.decoded(decoded)
    if shown.value is not None:
        return _first_line(json.dumps(shown.value, ensure_ascii=False, default=str))
    if shown.text is not None:
        return _first_line(shown.text)
    return sample_line(shown.data)


def sample_line(body):
    """The first line of a body, as an operator skims a list: text up to 120 characters, or
    what it is when it is not text."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(body) - 4:  # not just a character cut at SAMPLE_BYTES
            return f"(binary, starts {body[:8].hex(' ')})"
        text = body[: exc.start].decode("utf-8")
    return _first_line(text)


def _first_line(text):
    line = text.strip().split("\n", 1)[0].strip()
    return line[:120] + ("…" if len(line) > 120 else "")
