"""Masking private data wherever a message's content is shown (docs/security.md, "Private data").

Rules (recovery.models.MaskRule) name headers, JSON paths into JSON bodies and regular
expressions over text bodies; a global rule covers every message, a team's rule the messages in
that team's scopes. ``MaskingRules.load()`` reads and compiles them once (per request, per
export, per notification batch); ``masker_for(message)`` is the Masker for one message, which
turns headers, bodies, decoded documents and free text into what a viewer may see.

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
import types

import regex
from django.conf import settings

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

    def free_text(self, text):
        """Free text that may quote content (a notification line, an activity detail)."""
        if not text or not self.regexes:
            return text
        try:
            return self._sub(text)
        except MaskingTimeout:
            return WITHHELD


NO_MASKING = Masker()


@dataclasses.dataclass
class MaskingRules:
    """Every rule, compiled once: the global ones and each team's with its scopes."""

    global_rules: list
    team_rules: dict  # team id -> (scopes, rules)

    @classmethod
    def load(cls):
        from recovery.models import MaskRule, TeamScope

        global_rules, by_team = [], {}
        for rule in MaskRule.objects.all():
            try:
                compiled = (rule.kind, compile_rule(rule.kind, rule.pattern))
            except ValueError:
                continue  # saved through a form that checked it: cannot happen but by hand
            if rule.team_id is None:
                global_rules.append(compiled)
            else:
                by_team.setdefault(rule.team_id, []).append(compiled)
        scopes = {}
        for scope in TeamScope.objects.filter(team_id__in=by_team):
            scopes.setdefault(scope.team_id, []).append(scope)
        team_rules = {team: (scopes.get(team, []), rules) for team, rules in by_team.items()}
        return cls(global_rules, team_rules)

    def __bool__(self):
        return bool(self.global_rules or self.team_rules)

    def rules_for(self, vhost, queue, exchange):
        rules = list(self.global_rules)
        for scopes, team_rules in self.team_rules.values():
            if any(scope.matches(vhost, queue, exchange) for scope in scopes):
                rules += team_rules
        return rules

    def masker_for(self, message):
        if not self:
            return NO_MASKING
        return masker_of(
            self.rules_for(message.vhost, message.source_queue, message.source_exchange)
        )

    def team_masker(self, team_id):
        """For text that belongs to no one message: the global rules and ``team_id``'s; with
        no team, every team's too (the text may come from any of them)."""
        rules = list(self.global_rules)
        for team, (_scopes, team_rules) in self.team_rules.items():
            if team_id is None or team == team_id:
                rules += team_rules
        return masker_of(rules)


def masker_of(rules):
    if not rules:
        return NO_MASKING
    return Masker(
        headers=[c for kind, c in rules if kind == "header"],
        paths=[c for kind, c in rules if kind == "json_path"],
        regexes=[c for kind, c in rules if kind == "regex"],
    )


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


def view_of(scope, user, message, rules=None):
    """The View of ``message`` for a caller (their Scope and user); ``rules``: loaded once."""
    from recovery.models import Privilege, Unmask

    rules = MaskingRules.load() if rules is None else rules
    masker = rules.masker_for(message)
    may_unmask = bool(masker) and scope.may(Privilege.UNMASK, message)
    unmask = Unmask.active(user, message.pk) if may_unmask else None
    return View(
        bodies=scope.may(Privilege.BODIES, message),
        masker=NO_MASKING if unmask is not None else masker,
        may_unmask=may_unmask,
        unmask=unmask,
    )


def log_body_view(user, message_id, via, how, unmasked=False):
    """A body was shown (console detail, download, API body or detail, export): who, which,
    when, how; the activity log's ``body_view`` rows."""
    from recovery.models import Activity

    Activity.objects.create(
        user=user,
        action="body_view",
        message_id=message_id,
        via=via,
        detail={"message": message_id, "how": how, "unmasked": unmasked},
    )


def privacy_of(scope, rules=None):
    """``(vhost, queue, exchange) -> (masker, may read bodies)`` for rows that are not whole
    messages (a failure group's newest sample)."""
    from recovery.models import Privilege

    rules = MaskingRules.load() if rules is None else rules

    def of(vhost, queue, exchange):
        row = types.SimpleNamespace(vhost=vhost, source_queue=queue, source_exchange=exchange)
        return rules.masker_for(row), scope.may(Privilege.BODIES, row)

    return of


# How much of each sampled body the masking page tries a rule on.
SAMPLE_BODY_BYTES = 64 * 1024


def sample_matches(rules):
    """{rule id: (messages it masks something in, messages looked at)} over the newest
    MASK_RULE_SAMPLE messages each rule covers (a team's rule: in the team's scopes), the first
    SAMPLE_BODY_BYTES of each body: a rule that matches nothing shows as such."""
    from django.db.models import BinaryField, Q
    from django.db.models.expressions import RawSQL

    from recovery.bodies import readable
    from recovery.models import Message, TeamScope
    from recovery.models.teams import NOTHING

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
            masker = masker_of([(rule.kind, compile_rule(rule.kind, rule.pattern))])
            hits = sum(1 for message in sample if _masks_something(masker, message, readable))
            found[rule.pk] = (hits, len(sample))
    return found


SAMPLED_FIELDS = (
    "id",
    "headers",
    "vhost",
    "source_queue",
    "source_exchange",
    "content_type",
    "content_encoding",
    "properties",
)


def _masks_something(masker, message, readable):
    if masker.headers(message.headers) != message.headers:
        return True
    body = message.body_bytes
    if masker.body(body) != body:
        return True
    decoded = readable(message)
    if decoded is None:
        return False
    shown = masker.decoded(decoded)
    if decoded.value is not None:
        return shown.value != decoded.value
    return shown.text != decoded.text
