"""What an operator may ask of a bulk replay job, each limit and rule written once.

The engine (``recovery.replay.jobs``) checks a job's arguments with these; the API's request
serializer (``recovery.api.replay_jobs``) and the console's job form (``console.forms.replay``)
build their fields from the same specs, so the three accept and refuse the same values, with
the same words. Pure: Django's validators and settings only (the console form imports it).
"""

import math
from dataclasses import dataclass

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import BaseValidator, MaxValueValidator, MinValueValidator

VIAS = ("console", "api", "system")


class AboveValidator(BaseValidator):
    """An exclusive minimum (Django's MinValueValidator includes its limit)."""

    message = "Ensure this value is greater than %(limit_value)s."
    code = "min_value"

    def compare(self, a, b):
        return a <= b


@dataclass(frozen=True)
class NumberOption:
    """A numeric job option: its limits, and the words the API and the console show for it."""

    name: str
    minimum: float
    maximum: float
    whole: bool = False
    # True: the minimum itself is refused (the value must be above it).
    above_minimum: bool = False
    label: str = ""  # the console's
    help_text: str = ""  # the API's

    def validators(self):
        low = (AboveValidator if self.above_minimum else MinValueValidator)(self.minimum)
        return [low, MaxValueValidator(self.maximum)]

    def clean(self, value):
        """``value`` (a Python number, or None = not given) checked; ValidationError otherwise."""
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValidationError("A valid number is required.", code="invalid")
        if not math.isfinite(value):
            raise ValidationError("A valid number is required.", code="invalid")
        if self.whole and int(value) != value:
            raise ValidationError("A valid integer is required.", code="invalid")
        for validator in self.validators():
            validator(value)
        return int(value) if self.whole else float(value)


RATE = NumberOption(
    "rate",
    # The slowest pace worth a job: below RATE_YIELD_S between messages the runner hands the
    # job back and its task comes again after a countdown of up to 1/rate seconds, so 0.001/s
    # is one message every 16⅔ minutes; a rate near 0 would be a job that never ends, and a
    # countdown too far away for a date. The top is beyond any broker: omit rate for "as fast
    # as confirms allow".
    minimum=0.001,
    maximum=1_000_000,
    label="Rate (msgs/s)",
    help_text="Messages per second; omit for as fast as confirms allow.",
)
CANARY_SIZE = NumberOption(
    "canary_size",
    # The job row's column is a 32-bit integer; a canary larger than the job is the whole job.
    minimum=0,
    maximum=2_147_483_647,
    whole=True,
    label="Canary size",
)
CANARY_PAUSE_SECONDS = NumberOption(
    "canary_pause_seconds",
    # The runner holds its worker through the pause (heartbeating, watching for a cancel), so a
    # pause is bounded; a day still outlasts any delayed retry, which a canary pause must (see
    # recovery.replay.jobs: the canary is judged only after its messages could arrive).
    minimum=0,
    maximum=86400,
    label="Canary pause (s)",
)
CANARY_MAX_FAILURE_PCT = NumberOption(
    "canary_max_failure_pct",
    # The canary passes while fewer than this % came back (recovery.replay.safety.canary_reason):
    # at 0 no canary could ever pass, so only 0 itself is refused.
    minimum=0,
    maximum=100,
    above_minimum=True,
    label="Canary max failure %",
    help_text="Go on after the canary only below this % dead again "
    "(default REPLAY_CANARY_MAX_FAILURE_PCT).",
)
BREAKER_THRESHOLD_PCT = NumberOption(
    "breaker_threshold_pct",
    # 0 turns the breaker off (recovery.replay.safety.breaker_reason); 100 trips only when every
    # replayed message came back.
    minimum=0,
    maximum=100,
    label="Breaker at failure %",
    help_text="Pause when this % of replayed messages die again "
    "(default REPLAY_BREAKER_THRESHOLD_PCT; 0 = off).",
)

NUMBER_OPTIONS = (
    RATE,
    CANARY_SIZE,
    CANARY_PAUSE_SECONDS,
    CANARY_MAX_FAILURE_PCT,
    BREAKER_THRESHOLD_PCT,
)


def clean_job_options(
    rate=None,
    canary_size=0,
    canary_pause_seconds=0,
    canary_max_failure_pct=None,
    breaker_threshold_pct=None,
    via="console",
):
    """The numeric options and ``via`` checked, defaults applied: the ReplayJob fields they set.

    ValidationError naming each bad argument.
    """
    given = {
        "rate": rate,
        "canary_size": canary_size or 0,
        "canary_pause_seconds": canary_pause_seconds or 0,
        "canary_max_failure_pct": canary_max_failure_pct,
        "breaker_threshold_pct": breaker_threshold_pct,
    }
    errors, cleaned = {}, {}
    for option in NUMBER_OPTIONS:
        try:
            cleaned[option.name] = option.clean(given[option.name])
        except ValidationError as exc:
            errors[option.name] = exc.messages
    if via not in VIAS:
        errors["via"] = f"one of {', '.join(VIAS)}"
    if errors:
        raise ValidationError(errors)
    canary = cleaned["canary_size"]
    pct = cleaned["canary_max_failure_pct"]
    if canary and pct is None:
        pct = settings.REPLAY_CANARY_MAX_FAILURE_PCT
    breaker = cleaned["breaker_threshold_pct"]
    if breaker is None:
        breaker = settings.REPLAY_BREAKER_THRESHOLD_PCT
    return {
        "rate": cleaned["rate"],
        "canary_size": canary,
        "canary_pause_seconds": cleaned["canary_pause_seconds"] if canary else 0.0,
        "canary_max_failure_pct": pct if canary else None,
        "breaker_threshold_pct": breaker or None,
        "via": via,
    }


# ---- message ids ----------------------------------------------------------------------------

# How many ids one job may name: the list is stored on the job row (JSON) and becomes one
# ``IN (...)`` when the job's snapshot is taken. More messages than this: select by a filter.
MAX_MESSAGE_IDS = 100_000
# Message ids are bigint primary keys.
MIN_MESSAGE_ID, MAX_MESSAGE_ID = 1, 2**63 - 1


def parse_message_ids(values, limit=MAX_MESSAGE_IDS):
    """Message ids (ints, or digit strings as a form sends them) -> a list without repeats.

    ValidationError (one message) if one is not a message id, none is given or more than
    ``limit`` are. The limit counts the ids as given, as the API's schema states it (maxItems).
    """
    if isinstance(values, str | bytes) or not hasattr(values, "__iter__"):
        raise ValidationError("A list of message ids is required.", code="invalid")
    values = list(values)
    if not values:
        raise ValidationError("No message ids given.", code="empty")
    if len(values) > limit:
        raise ValidationError(
            f"At most {limit} message ids; select more by a filter.", code="max_length"
        )
    ids = []
    for value in values:
        if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
            value = int(value.strip())
        if (
            isinstance(value, bool)
            or not isinstance(value, int)
            or not MIN_MESSAGE_ID <= value <= MAX_MESSAGE_ID
        ):
            raise ValidationError(f"{value!r} is not a message id.", code="invalid")
        ids.append(value)
    return list(dict.fromkeys(ids))


def split_message_ids(text, limit=MAX_MESSAGE_IDS):
    """``"1, 2,3"`` (the console's hidden field / checkboxes) -> parse_message_ids; [] if blank."""
    parts = [part.strip() for part in text.split(",") if part.strip()]
    return parse_message_ids(parts, limit) if parts else []


# ---- the target -------------------------------------------------------------------------------

QUEUE_OR_EXCHANGE = "Choose a queue or an exchange and routing key, not both."


def names_queue_and_exchange(queue, exchange, routing_key):
    """True when a target names a queue and also an exchange or a routing key.

    None means "not given". An empty exchange is the default exchange, named on purpose: with a
    queue that is two targets too (the console sends None for a blank field).
    """
    return bool(queue) and (exchange is not None or routing_key is not None)
