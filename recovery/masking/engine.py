"""Masking private data wherever a message's content is shown (docs/security.md, "Private data").

Rules (recovery.models.MaskRule) name headers, JSON paths into JSON bodies and regular
expressions over text bodies; a global rule covers every message, a team's rule the messages in
that team's scopes. This module is the engine, with no models: ``compile_rule`` checks and
compiles one rule, a ``Masker`` (the rules for one message) turns headers, bodies, decoded
documents and free text into what a viewer may see. Loading the rules and deciding who sees
what are recovery.models.masking (``MaskingRules``) and recovery.masking.policy (``view_of``).

Stored bytes never change: only what is shown, downloaded, exported or sent out is masked; a
replay sends the stored bytes.

A regular expression runs with a time limit (the ``regex`` package's ``timeout``,
MASK_REGEX_TIMEOUT_MS): a rule that backtracks catastrophically on some body cannot hold a
worker. When a rule cannot finish, the content is withheld whole (``WITHHELD``) and says so:
failing closed, never showing what the rule was meant to hide.

JSON paths and bodies that are not one plain UTF-8 document (#46): a JSON path is applied to
every body that *looks* like JSON (its first character past a byte-order mark and white space is
``{`` or ``[``), however it is written, and a body that looks like JSON but cannot be read
unambiguously is withheld whole (``WITHHELD_JSON``), never shown as stored:

- a byte-order mark (UTF-8, as .NET writes; UTF-16 and UTF-32) is read past, and kept;
- bytes that are not UTF-8 are read as the mark says, as UTF-16/32 when RFC 4627's null-byte
  pattern says so and the text then looks like JSON, else as Latin-1 (each byte one character:
  any ASCII-compatible 8-bit charset's JSON punctuation reads right), and the masked text is
  written back the same way;
- a key an object holds more than once is masked in every occurrence (``json.loads`` keeps the
  last one only: a path would miss the first), and every occurrence stays shown;
- several documents, one a line (NDJSON), are masked line by line;
- anything else (a cut document, a syntax error, a line of NDJSON that is not JSON) is withheld.
What a JSON path does not reach: JSON inside other text (a log line, XML, a form field) and a
body that does not start as JSON; regular expressions are for those.
"""

import codecs
import copy
import dataclasses
import json
import re

import regex
from django.conf import settings

from recovery.bodies.decode import ENCODERS, DecodeError
from recovery.dead_letters import (
    EXCEPTION_MESSAGE_HEADERS,
    EXCEPTION_TYPE_HEADERS,
    label_message,
)

MASK = "[masked]"
WITHHELD = "[withheld: a masking rule could not finish on this content in time]"
WITHHELD_JSON = (
    "[withheld: a JSON-path masking rule applies here, and this body looks like JSON "
    "but cannot be read as JSON ({why})]"
)
WITHHELD_PREFIX = "[withheld: "
BOM = "\ufeff"
# Checked in this order: UTF-32 LE's mark starts with UTF-16 LE's.
BYTE_ORDER_MARKS = (
    (codecs.BOM_UTF32_LE, "utf-32-le"),
    (codecs.BOM_UTF32_BE, "utf-32-be"),
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)

# $.a.b, $['a key'], $.items[0], $.items[*].email, $..email (any depth), $.*
_PATH_STEP = re.compile(
    r"""\.\.(?P<deep>[A-Za-z_][\w-]*)"""
    r"""|\.(?P<key>[A-Za-z_][\w-]*|\*)"""
    r"""|\[(?P<index>\d+|\*)\]"""
    r"""|\[(?P<q>['"])(?P<quoted>.*?)(?P=q)\]"""
)
ANY = object()


class MaskingTimeout(Exception):
    """A regular expression ran past MASK_REGEX_TIMEOUT_MS."""


class UnreadableJson(Exception):
    """A body a JSON path applies to looks like JSON but cannot be read as JSON."""


def is_withheld(text):
    return isinstance(text, str) and text.startswith(WITHHELD_PREFIX)


def parse_json_path(text):
    """A JSON path as steps: ("key", name | ANY), ("index", n | ANY), ("deep", name).
    ValueError says what is wrong."""
    text = text.strip()
    if not text:
        raise ValueError("a JSON path is needed, e.g. $.card.number")
    rest = text[1:] if text.startswith("$") else "." + text
    steps, pos = [], 0
    while pos < len(rest):
        match = _PATH_STEP.match(rest, pos)
        if match is None:
            raise ValueError(
                f"not a JSON path: cannot read {rest[pos:]!r} "
                "(write $.a.b, $.items[*].email, $['a key'] or $..email)"
            )
        if match["deep"]:
            steps.append(("deep", match["deep"]))
        elif match["key"]:
            steps.append(("key", ANY if match["key"] == "*" else match["key"]))
        elif match["index"]:
            steps.append(("index", ANY if match["index"] == "*" else int(match["index"])))
        else:
            steps.append(("key", match["quoted"]))
        pos = match.end()
    if not steps:
        raise ValueError("a JSON path names at least one key, e.g. $.card.number")
    return steps


def compile_rule(kind, pattern):
    """The compiled form of one rule; ValueError (a form error) when it cannot be one."""
    if kind == "header":
        name = pattern.strip().lower()
        if not name:
            raise ValueError("a header name is needed")
        return name
    if kind == "json_path":
        return parse_json_path(pattern)
    if kind == "regex":
        if not pattern:
            raise ValueError("a regular expression is needed")
        try:
            compiled = regex.compile(pattern)
        except (regex.error, OverflowError, RecursionError) as exc:
            raise ValueError(f"not a valid regular expression: {exc}") from None
        if compiled.fullmatch("") is not None:
            raise ValueError("this expression matches the empty text: it would mask nothing")
        return compiled
    raise ValueError(f"unknown rule kind {kind!r}")


class Repeated:
    """The values, in order, of a key one JSON object holds more than once (as read by
    ``loads``): each is masked and shown, none is dropped."""

    __slots__ = ("values",)

    def __init__(self, values):
        self.values = values


def _occurrences(value):
    return value.values if isinstance(value, Repeated) else (value,)


def _masked(value):
    return Repeated([MASK] * len(value.values)) if isinstance(value, Repeated) else MASK


def _children(node, kind, key):
    if kind == "key" and isinstance(node, dict):
        return list(node) if key is ANY else ([key] if key in node else [])
    if kind == "index" and isinstance(node, list):
        if key is ANY:
            return list(range(len(node)))
        return [key] if key < len(node) else []
    return []


def _mask_path(node, steps, i=0):
    """Mask in place what ``steps[i:]`` reaches in ``node``; how many values were masked."""
    kind, key = steps[i]
    last = i == len(steps) - 1
    masked = 0
    if kind == "deep":
        if isinstance(node, dict):
            for name in list(node):
                if name == key and last:
                    node[name] = _masked(node[name])
                    masked += 1
                    continue
                for value in _occurrences(node[name]):
                    if name == key:
                        masked += _mask_path(value, steps, i + 1)
                    masked += _mask_path(value, steps, i)
        elif isinstance(node, list):
            for item in node:
                masked += _mask_path(item, steps, i)
        return masked
    for child in _children(node, kind, key):
        if last:
            node[child] = _masked(node[child])
            masked += 1
        else:
            for value in _occurrences(node[child]):
                masked += _mask_path(value, steps, i + 1)
    return masked


def _object(pairs):
    """``json.loads``'s object_pairs_hook: a dict, a repeated key's values kept (Repeated)."""
    out = {}
    for key, value in pairs:
        if key not in out:
            out[key] = value
        elif isinstance(out[key], Repeated):
            out[key].values.append(value)
        else:
            out[key] = Repeated([out[key], value])
    return out


def _has_repeated(value):
    if isinstance(value, Repeated):
        return True
    if isinstance(value, dict):
        return any(_has_repeated(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_repeated(v) for v in value)
    return False


def _dumps(value):
    """JSON text of a value ``loads`` read, a repeated key written once per occurrence."""
    if not _has_repeated(value):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, dict):
        items = (
            f"{json.dumps(key, ensure_ascii=False)}: {_dumps(one)}"
            for key, item in value.items()
            for one in _occurrences(item)
        )
        return "{" + ", ".join(items) + "}"
    return "[" + ", ".join(_dumps(item) for item in value) + "]"


def looks_like_json(text):
    return text.lstrip(BOM + " \t\r\n")[:1] in ("{", "[")


def _mask_json_document(text, paths):
    """(masked text or ``text`` itself when no path reached anything, values masked);
    UnreadableJson when it does not parse."""
    try:
        parsed = json.loads(text, object_pairs_hook=_object)
    except ValueError as exc:
        raise UnreadableJson(str(exc)) from None
    masked = sum(_mask_path(parsed, steps) for steps in paths)
    return (_dumps(parsed) if masked else text), masked


def mask_json_text(text, paths):
    """``text`` with the JSON paths masked when it looks like JSON (see the module's doc): one
    document, or NDJSON line by line; a byte-order mark kept. UnreadableJson says why not."""
    bom = BOM if text.startswith(BOM) else ""
    inner = text[len(bom) :]
    if not looks_like_json(inner):
        return text
    try:
        shown, masked = _mask_json_document(inner, paths)
    except UnreadableJson:
        lines = inner.split("\n")
        if len([line for line in lines if line.strip()]) < 2:
            raise
        shown, masked = _mask_lines(lines, paths)
    return bom + shown if masked else text


def _mask_lines(lines, paths):
    out, masked = [], 0
    for number, line in enumerate(lines, 1):
        if not line.strip():
            out.append(line)
            continue
        try:
            shown, n = _mask_json_document(line, paths)
        except UnreadableJson as exc:
            raise UnreadableJson(f"line {number} of {len(lines)}: {exc}") from None
        out.append(shown)
        masked += n
    return "\n".join(out), masked


def read_text(data):
    """(text, encoding, byte-order mark) of body bytes as masking reads them: what a byte-order
    mark names; UTF-16/32 by RFC 4627's null bytes when that reads as JSON (checked before
    UTF-8: UTF-16 ASCII is valid UTF-8, with a NUL every other byte); UTF-8; else Latin-1 (each
    byte one character). Encoding None when a byte-order mark's encoding does not decode."""
    for mark, encoding in BYTE_ORDER_MARKS:
        if data.startswith(mark):
            try:
                return data[len(mark) :].decode(encoding), encoding, mark
            except UnicodeDecodeError:
                return None, None, mark
    guess = json.detect_encoding(data[:4])
    if guess != "utf-8":
        try:
            text = data.decode(guess)
        except UnicodeDecodeError:
            text = None
        if text is not None and looks_like_json(text):
            return text, guess, b""
    try:
        return data.decode("utf-8"), "utf-8", b""
    except UnicodeDecodeError:
        return data.decode("latin-1"), "latin-1", b""


class Masker:
    """The rules that apply to one message, compiled; each method returns a masked copy."""

    def __init__(self, headers=(), paths=(), regexes=()):
        self.header_names = frozenset(headers)
        self.paths = list(paths)
        self.regexes = list(regexes)

    def __bool__(self):
        return bool(self.header_names or self.paths or self.regexes)

    def _sub(self, text):
        timeout = settings.MASK_REGEX_TIMEOUT_MS / 1000
        for compiled in self.regexes:
            try:
                text = compiled.sub(MASK, text, timeout=timeout)
            except TimeoutError:
                raise MaskingTimeout(compiled.pattern) from None
        return text

    def headers(self, table):
        """Stored (tagged JSON) headers with the named ones' values masked."""
        if not self.header_names or not table:
            return table
        return {k: (MASK if k.lower() in self.header_names else v) for k, v in table.items()}

    def value(self, value):
        """A JSON document (decoded or parsed) with the paths masked; a copy."""
        if not self.paths or not isinstance(value, dict | list):
            return value
        value = copy.deepcopy(value)
        for steps in self.paths:
            _mask_path(value, steps)
        return value

    def _leaves(self, value):
        """The regular expressions over a document's strings (keys and values)."""
        if not self.regexes:
            return value
        if isinstance(value, str):
            return self._sub(value)
        if isinstance(value, dict):
            return {self._leaves(k): self._leaves(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self._leaves(item) for item in value]
        return value

    def text(self, text):
        """A text body: JSON paths where it looks like JSON (withheld whole when it cannot be
        read as JSON: WITHHELD_JSON), then the regular expressions. A body no path matched
        keeps its own formatting."""
        if text is None or not self:
            return text
        try:
            if self.paths:
                text = mask_json_text(text, self.paths)
            return self._sub(text)
        except (MaskingTimeout, RecursionError):
            return WITHHELD
        except UnreadableJson as exc:
            return WITHHELD_JSON.format(why=exc)

    def body(self, data):
        """Body bytes as a viewer may have them: read as text (``read_text``: UTF-8, by its
        byte-order mark, UTF-16/32 JSON, else Latin-1, each byte one character, so bytes around
        a match stay as they are), masked as text, and written back the same way."""
        data = bytes(data)
        if not self:
            return data
        text, encoding, mark = read_text(data)
        if encoding is None:
            # A byte-order mark whose encoding does not decode: what a path would reach in it
            # cannot be found, so it is not shown.
            return WITHHELD_JSON.format(why=f"not {mark.hex(' ')}-marked text").encode()
        shown = self.text(text)
        if is_withheld(shown):
            return shown.encode("utf-8")
        if shown == text:
            return data
        # backslashreplace: a character the encoding lacks came from a JSON \u escape the
        # masked document was written back from: the escape again.
        return mark + shown.encode(encoding, "backslashreplace")

    def stored(self, data, decoded):
        """The stored bytes as a viewer may have them (the raw views, a download, the API's
        raw body, an export). ``decoded``: the body's decoded form
        (recovery.models.decoders.readable), or None for a body read as it is stored.

        A compressed, encoded or binary-document body (gzip, base64, MessagePack, protobuf...)
        hides its content from the rules as stored (and a reader undoes the layers in a
        moment), so it is re-encoded from its masked document through the same chain; where
        that cannot be done (the mask does not fit a protobuf field, a layer failed), the raw
        bytes are withheld whole. Where the rules change nothing, the stored bytes as they are."""
        data = bytes(data)
        if not self:
            return data
        if decoded is None or not (decoded.chain or decoded.error):
            return self.body(data)
        if decoded.error is None and not decoded.truncated:
            try:
                if decoded.document is not None and decoded.value is not None:
                    masked = self._leaves(self.value(decoded.value))
                    return data if masked == decoded.value else decoded.encode(masked)
                if decoded.text is not None:
                    text = self.text(decoded.text)
                    if is_withheld(text):
                        return text.encode("utf-8")
                    if text == decoded.text:
                        return data
                    inner = text.encode("utf-8")
                    for layer in decoded.layers:
                        inner = ENCODERS[layer](inner)
                    return inner
            except (DecodeError, MaskingTimeout, RecursionError, KeyError):
                pass
        return WITHHELD.encode()

    def decoded(self, decoded):
        """A recovery.bodies.Decoded with its document, text and bytes masked."""
        if decoded is None or not self:
            return decoded
        value = decoded.value
        try:
            if value is not None:
                value = self._leaves(self.value(value))
                text = json.dumps(value, indent=2, ensure_ascii=False, default=str)
                text = self._sub(text)
            else:
                text = self.text(decoded.text)
        except (MaskingTimeout, RecursionError):
            value, text = None, WITHHELD
        return dataclasses.replace(
            decoded,
            value=value,
            text=text,
            data=self.body(decoded.data),
            # An edit of a masked rendering would send the mask: edit from the unmasked view.
            document=None,
        )

    def label(self, label, headers):
        """A failure group's label, made from exception headers when the message was stored:
        the masked headers' values cut out of it, then the regular expressions."""
        if not label or not self:
            return label
        for name, value in (headers or {}).items():
            if name.lower() in self.header_names and isinstance(value, str) and value:
                # As the collector put it in (recovery.collector.rows._group).
                for shown in (value, value[:200], label_message(value)):
                    if shown.strip():
                        label = label.replace(shown, MASK)
        return self.free_text(label)

    def label_without_headers(self, label):
        """A failure group's label when the headers it was made from are gone (the history of
        a message retention deleted): where a header rule names an exception header, all but
        the label's place and reason (its first two parts) is masked, failing closed since the
        values to cut out are unknown; then the regular expressions."""
        if not label or not self:
            return label
        if self.header_names & LABEL_HEADERS:
            parts = label.split(" · ")
            if len(parts) > 2:
                label = " · ".join([*parts[:2], MASK])
        return self.free_text(label)

    def free_text(self, text):
        """Free text that may quote content (a notification line, an activity detail)."""
        if not text or not self.regexes:
            return text
        try:
            return self._sub(text)
        except MaskingTimeout:
            return WITHHELD


# The headers a failure group's label quotes (recovery.collector.rows.failure_group).
LABEL_HEADERS = frozenset(EXCEPTION_TYPE_HEADERS + EXCEPTION_MESSAGE_HEADERS)
NO_MASKING = Masker()


def masker_of(rules):
    if not rules:
        return NO_MASKING
    return Masker(
        headers=[c for kind, c in rules if kind == "header"],
        paths=[c for kind, c in rules if kind == "json_path"],
        regexes=[c for kind, c in rules if kind == "regex"],
    )
