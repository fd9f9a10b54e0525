"""What a rule's ``params`` may hold, per kind: the one definition the API serializer and the
console form both enforce (and docs/alerts.md lists), so a saved rule can always be checked.

Without it, ``{"threshold": "abc"}``, ``window_minutes: 0`` or ``1e20`` were saved and then
failed every evaluation (TypeError, ZeroDivisionError, OverflowError), and ``\\u0000`` or a
5,000-deep object was a 500. Checks read the params with these defaults
(recovery/alerts/checks.py); a rule created in code (or saved before) bypasses this, a person
never does, and ``run_check`` refuses to check such a rule: it is unknown, saying which param.

Also here: the scope's vhost (one Lazarus watches) and a channel's target, for the same reason.
"""

import math
import re
from dataclasses import dataclass

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import validate_email

# Params are a flat object of scalars; anything nested this deep is refused before it is walked
# further (a Python recursion limit is not a validation rule).
MAX_DEPTH = 4

WEEK_MINUTES = 7 * 24 * 60
# How far a rule's own times reach, said here for the console's form and the API alike: how
# long a check may fail before "unknown" is told (for_seconds), how often a firing rule reminds,
# and how long a mute lasts.
FOR_SECONDS_MAX = WEEK_MINUTES * 60
REMIND_SECONDS_MAX = WEEK_MINUTES * 60
MUTE_MINUTES_MAX = 30 * 24 * 60
COUNT_MAX = 10**12  # far above any real backlog, far below float/bigint trouble
TIME_OF_DAY = re.compile(r"^([01]?\d|2[0-3]):([0-5]\d)$", re.ASCII)


@dataclass(frozen=True)
class Param:
    """One parameter: ``type`` is integer, number, boolean or time (``HH:MM`` UTC)."""

    type: str
    default: object
    minimum: float | None = None
    maximum: float | None = None
    nullable: bool = False

    def problem(self, value) -> str | None:
        if value is None:
            return None if self.nullable else "must not be null"
        if self.type == "boolean":
            return None if isinstance(value, bool) else "must be true or false"
        if self.type == "time":
            if isinstance(value, str) and TIME_OF_DAY.match(value):
                return None
            return 'must be a time of day as "HH:MM" (UTC)'
        # bool is an int in Python; JSON's true is not a number.
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"must be {'an integer' if self.type == 'integer' else 'a number'}"
        if isinstance(value, float) and not math.isfinite(value):
            return "must be a finite number"
        if self.type == "integer" and not isinstance(value, int):
            return "must be an integer"
        if self.minimum is not None and value < self.minimum:
            return f"must be at least {self.minimum:g}"
        if self.maximum is not None and value > self.maximum:
            return f"must be at most {self.maximum:g}"
        return None


def _window(default):
    return Param("integer", default, minimum=1, maximum=WEEK_MINUTES)


def _count(default):
    return Param("integer", default, minimum=0, maximum=COUNT_MAX)


PARAMS: dict[str, dict[str, Param]] = {
    "new_failure_group": {"window_minutes": _window(60)},
    "open_messages": {"threshold": _count(0)},
    "open_growth": {
        "per_minute": Param("number", 100, minimum=0, maximum=10**9),
        "window_minutes": _window(10),
    },
    "collector_down": {"seconds": Param("integer", 60, minimum=1, maximum=WEEK_MINUTES * 60)},
    "collector_lag": {"threshold": _count(1000)},
    "replay_job": {"window_minutes": _window(60)},
    "audit": {
        "lost_above": _count(0),
        "loss_ppm_above": Param("number", None, minimum=0, maximum=10**6, nullable=True),
        "warnings": Param("boolean", True),
        "missing_after": Param("time", "06:00"),
    },
    "broker_alarm": {},
    "queue_without_consumers": {},
    "uncovered_queues": {},
    "broker_tally": {"threshold": _count(0), "window_minutes": _window(15)},
    "retention_archive": {},
}


def _shape_problem(value, depth=1) -> str | None:
    """NUL characters (PostgreSQL's jsonb refuses them), non-finite numbers and depth, anywhere
    in the value: checked before the kind's own rules so even an unknown key is safe to name."""
    if depth > MAX_DEPTH:
        return f"nested deeper than {MAX_DEPTH} levels"
    if isinstance(value, str):
        return "must not contain NUL (\\u0000) characters" if "\x00" in value else None
    if isinstance(value, float) and not math.isfinite(value):
        return "numbers must be finite (no NaN or Infinity)"
    if isinstance(value, dict):
        for key, item in value.items():
            problem = _shape_problem(str(key), depth) or _shape_problem(item, depth + 1)
            if problem:
                return problem
    if isinstance(value, list):
        for item in value:
            problem = _shape_problem(item, depth + 1)
            if problem:
                return problem
    return None


def params_problems(kind, params) -> list[str]:
    """Everything wrong with ``params`` for ``kind`` (empty: it may be saved)."""
    if not isinstance(params, dict):
        return ["must be a JSON object"]
    shape = _shape_problem(params)
    if shape:
        return [shape]
    known = PARAMS.get(kind)
    if known is None:
        return []  # the kind itself is refused by its own field
    problems = []
    for name, value in params.items():
        if name not in known:
            allowed = ", ".join(known) or "none"
            problems.append(f"{name}: not a parameter of {kind} (its parameters: {allowed})")
            continue
        problem = known[name].problem(value)
        if problem:
            problems.append(f"{name}: {problem}")
    return problems


def validate_params(kind, params) -> dict:
    """``params`` if valid, else a ``ValidationError`` listing every problem."""
    problems = params_problems(kind, params)
    if problems:
        raise ValidationError(problems)
    return params


def vhost_problem(vhost) -> str | None:
    """A rule's scope may only name a vhost Lazarus watches: another vhost's queue names are not
    Lazarus's to show (its checks would read them through the management API)."""
    if vhost and vhost not in settings.RECOVERY_VHOSTS:
        watched = ", ".join(settings.RECOVERY_VHOSTS)
        return f"not a vhost Lazarus watches (RECOVERY_VHOSTS: {watched})"
    return None


def target_problems(kind, target) -> list[str]:
    """A channel's target for its kind: an http(s) URL (webhook, slack) or comma-separated email
    addresses. ``target`` is stripped by the caller."""
    if "\x00" in target:
        return ["must not contain NUL (\\u0000) characters"]
    if kind in ("webhook", "slack"):
        if not target.startswith(("http://", "https://")):
            return ["an http:// or https:// URL"]
        return []
    if kind == "email":
        addresses = [a.strip() for a in target.split(",") if a.strip()]
        if not addresses:
            return ["one or more email addresses, comma-separated"]
        problems = []
        for address in addresses:
            try:
                validate_email(address)
            except ValidationError:
                problems.append(f"not an email address: {address}")
        return problems
    return []
