"""Masking private data wherever a message's content is shown (docs/security.md, "Private data").

Rules (recovery.models.MaskRule) name headers, JSON paths into JSON bodies and regular
expressions over text bodies; a global rule covers every message, a team's rule the messages in
that team's scopes. This module is the engine, with no models: ``compile_rule`` checks and
compiles one rule, a ``Masker`` (the rules for one message) turns headers, bodies, decoded
documents and free text into what a viewer may see. Loading the rules and deciding who sees
what is recovery.models.masking (``MaskingRules``, ``view_of``).

Stored bytes never change: only what is shown, downloaded, exported or sent out is masked; a
replay sends the stored bytes.

A regular expression runs with a time limit (the ``regex`` package's ``timeout``,
MASK_REGEX_TIMEOUT_MS): a rule that backtracks catastrophically on some body cannot hold a
worker. When a rule cannot finish, the content is withheld whole (``WITHHELD``) and says so:
failing closed, never showing what the rule was meant to hide.
"""

import copy
import dataclasses
import json
import re

import regex
from django.conf import settings

from recovery.bodies.decode import ENCODERS, DecodeError
from recovery.collector.rows import label_message

MASK = "[masked]"
WITHHELD = "[withheld: a masking rule could not finish on this content in time]"

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
                if name == key:
                    if last:
                        node[name] = MASK
                        masked += 1
                        continue
                    masked += _mask_path(node[name], steps, i + 1)
                masked += _mask_path(node[name], steps, i)
        elif isinstance(node, list):
            for item in node:
                masked += _mask_path(item, steps, i)
        return masked
    for child in _children(node, kind, key):
        if last:
            node[child] = MASK
            masked += 1
        else:
            masked += _mask_path(node[child], steps, i + 1)
    return masked


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
        """A text body: JSON paths where it is a JSON document, then the regular expressions.
        A body no path matched keeps its own formatting."""
        if text is None or not self:
            return text
        try:
            if self.paths:
                text = self._json_text(text)
            return self._sub(text)
        except (MaskingTimeout, RecursionError):
            return WITHHELD

    def _json_text(self, text):
        try:
            parsed = json.loads(text)
        except ValueError:
            return text
        if not isinstance(parsed, dict | list):
            return text
        masked = sum(_mask_path(parsed, steps) for steps in self.paths)
        return json.dumps(parsed, ensure_ascii=False) if masked else text

    def body(self, data):
        """Body bytes as a viewer may have them: UTF-8 text masked as text; other bytes with
        the regular expressions over their Latin-1 reading (each byte one character), so bytes
        around a match stay as they are."""
        data = bytes(data)
        if not self:
            return data
        try:
            return self.text(data.decode("utf-8")).encode("utf-8")
        except UnicodeDecodeError:
            pass
        if not self.regexes:
            return data
        try:
            return self._sub(data.decode("latin-1")).encode("latin-1")
        except MaskingTimeout:
            return WITHHELD.encode()

    def stored(self, data, decoded):
        """The stored bytes as a viewer may have them (the raw views, a download, the API's
        raw body, an export). ``decoded``: the body's decoded form (recovery.bodies.readable),
        or None for a body read as it is stored.

        A compressed, encoded or binary-document body (gzip, base64, MessagePack, protobuf...)
        hides its content from the rules as stored (and a reader undoes the layers in a
        moment), so it is re-encoded from its masked document through the same chain; where
        that cannot be done (the mask does not fit a protobuf field, a layer failed), the raw
        bytes are withheld whole."""
        data = bytes(data)
        if not self:
            return data
        if decoded is None or not (decoded.chain or decoded.error):
            return self.body(data)
        if decoded.error is None and not decoded.truncated:
            try:
                if decoded.document is not None and decoded.value is not None:
                    masked = self._leaves(self.value(decoded.value))
                    return decoded.encode(masked)
                if decoded.text is not None:
                    inner = self.text(decoded.text).encode("utf-8")
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

    def free_text(self, text):
        """Free text that may quote content (a notification line, an activity detail)."""
        if not text or not self.regexes:
            return text
        try:
            return self._sub(text)
        except MaskingTimeout:
            return WITHHELD


NO_MASKING = Masker()


def masker_of(rules):
    if not rules:
        return NO_MASKING
    return Masker(
        headers=[c for kind, c in rules if kind == "header"],
        paths=[c for kind, c in rules if kind == "json_path"],
        regexes=[c for kind, c in rules if kind == "regex"],
    )
