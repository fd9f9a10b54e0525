"""What Lazarus cannot collect: application queues whose dead letters never reach
``recovery.dlx`` and exchanges whose unroutable messages never reach ``recovery.unrouted``.

A queue without a dead-letter exchange (neither the ``x-dead-letter-exchange`` argument nor a
policy) loses every message it rejects, expires or overflows, and nobody is told. RabbitMQ
applies only the highest-priority policy matching a queue, so a queue with a policy of its own
that says nothing of dead-lettering hides Lazarus's policy: that is said too, with the fix.
"""

import re
from dataclasses import asdict, dataclass

from django.conf import settings

from recovery.broker.management import Management
from recovery.broker.topology import (
    AE_POLICY,
    DLX_POLICY,
    FIRST_VERSION_WITH_DEFAULT_LIMIT,
    RECOVERY_POLICY,
    Names,
    broker_version,
)
from recovery.errors import ManagementError

# RabbitMQ 4.0+ gives a quorum queue this delivery limit when nothing sets one.
DEFAULT_DELIVERY_LIMIT = 20
UNLIMITED = "unlimited"


@dataclass(frozen=True)
class Uncovered:
    vhost: str
    kind: str  # queue | exchange
    name: str
    # no_dead_letter_exchange | dead_letters_elsewhere | dead_letters_at_most_once |
    # no_alternate_exchange | recovery_delivery_limit | delivery_limit_unknown
    problem: str
    detail: str
    fix: str
    policy: str = ""  # the queue's own policy that hides Lazarus's, if any

    def as_dict(self):
        return asdict(self)


def _ours(name, names):
    own = {names.dlx, names.dead_letters, names.unrouted, names.returns, names.quarantine}
    return (
        name in own
        or name == names.parked
        or name.startswith(("amq.", "recovery.", "lazarus-", settings.REPLAY_DELAY_PREFIX + "."))
        or name == ""
    )


# Since 3.12 a policy can apply to one queue type only.
_APPLY_TO_TYPE = {"classic_queues": "classic", "quorum_queues": "quorum", "streams": "stream"}


def _policy_for(policies, name, applies_to, queue_type=None):
    """The policy RabbitMQ applies to ``name``: the highest priority whose pattern matches.

    ``queue_type`` (a queue's ``type``): a policy that applies to ``classic_queues``,
    ``quorum_queues`` or ``streams`` matches that type of queue only; without it, such a
    policy may or may not apply, and is taken to (it would hide Lazarus's)."""

    def applies(p):
        target = p.get("apply-to")
        if target in (applies_to, "all"):
            return True
        if applies_to == "queues" and target in _APPLY_TO_TYPE:
            return queue_type is None or _APPLY_TO_TYPE[target] == queue_type
        return False

    matching = [p for p in policies if applies(p) and re.search(p.get("pattern", ""), name)]
    return max(matching, key=lambda p: p.get("priority", 0), default=None)


def read_operator_policies(management, vhost):
    """The vhost's operator policies, or None when they cannot be read (a user without the
    policymaker or administrator tag): then a limit they might set is unknown."""
    try:
        return management.request("GET", f"/operator-policies/{management.quote(vhost)}") or []
    except ManagementError:
        return None


def effective_delivery_limit(queue, version, policies=None, operator_policies=None):
    """A queue's delivery limit as the broker applies it: an int, UNLIMITED, or None (unknown).

    4.x reports it (``delivery_limit``, a statistic); otherwise it is worked out the broker's way
    from the argument and the effective (user + operator) policy: the lower of the two, but a
    negative one (unlimited) gives way to a positive one. Without the queue's
    ``effective_policy_definition`` (a statistic too: missing with statistics disabled, and for
    a few seconds after a queue is declared) the policies are matched here, when both lists
    could be read. A field that is missing is unknown, never "no limit"."""
    kind = queue.get("type")
    if kind is None:
        return None
    if kind != "quorum":
        return UNLIMITED  # classic queues and streams never drop a message for its returns
    reported = queue.get("delivery_limit")
    if reported is not None:
        return _limit(reported)
    definition = effective_definition(queue, policies, operator_policies)
    if definition is None or "arguments" not in queue:
        return None
    argument = (queue.get("arguments") or {}).get("x-delivery-limit")
    values = [v for v in (argument, definition.get("delivery-limit")) if isinstance(v, int)]
    if not values:
        if version is None:
            return None
        return DEFAULT_DELIVERY_LIMIT if version >= FIRST_VERSION_WITH_DEFAULT_LIMIT else UNLIMITED
    return _limit(_resolve(values))


def _resolve(values):
    """RabbitMQ's rule for two delivery limits: the lower, unless one is negative (then the
    higher: a positive limit wins over "unlimited")."""
    return max(values) if min(values) < 0 else min(values)


def effective_definition(queue, policies, operator_policies):
    """The queue's effective policy definition, as reported or as matched from the policy lists
    (None: unknown)."""
    if "effective_policy_definition" in queue:
        return queue.get("effective_policy_definition") or {}
    if policies is None or operator_policies is None:
        return None
    name, kind = queue.get("name", ""), queue.get("type")
    definition = dict((_policy_for(policies, name, "queues", kind) or {}).get("definition", {}))
    operator = (_policy_for(operator_policies, name, "queues", kind) or {}).get("definition", {})
    for key, value in operator.items():
        mine = definition.get(key)
        if key == "delivery-limit" and isinstance(mine, int) and isinstance(value, int):
            definition[key] = _resolve([mine, value])
        elif isinstance(mine, int) and isinstance(value, int):
            definition[key] = min(mine, value)  # operator policies cap numeric values
        else:
            definition[key] = value
    return definition


def _limit(value):
    if value == UNLIMITED or (isinstance(value, int) and value < 0):
        return UNLIMITED
    return value if isinstance(value, int) else None


def recovery_limits(
    vhost, queues, version, names, policies=None, operator_policies=None
) -> list[Uncovered]:
    """Lazarus's own quorum queues whose delivery limit is not known to be unlimited: past it the
    broker parks a message (or drops it, if the parking policy is hidden)."""
    out = []
    for queue in queues:
        name = queue.get("name", "")
        if name not in names.limited_queues:
            continue
        limit = effective_delivery_limit(queue, version, policies, operator_policies)
        if limit == UNLIMITED:
            continue
        definition = effective_definition(queue, policies, operator_policies) or {}
        dlx = (queue.get("arguments") or {}).get("x-dead-letter-exchange") or definition.get(
            "dead-letter-exchange"
        )
        past = (
            f"parked in {names.parked} (the collector stores it)"
            if dlx == names.parked
            else "dropped by the broker"
        )
        caps = [
            f"{kind} {queue[key]!r}"
            for kind, key in (("policy", "policy"), ("operator policy", "operator_policy"))
            if queue.get(key) and queue[key] != RECOVERY_POLICY
        ]
        fix = f"manage.py wire (policy {RECOVERY_POLICY})" + (
            f"; {' and '.join(caps)} sets it" if caps else ""
        )
        if limit is None:
            out.append(
                Uncovered(
                    vhost,
                    "queue",
                    name,
                    "delivery_limit_unknown",
                    "the management API does not say this recovery queue's delivery limit "
                    "(statistics or policy fields disabled?): it may drop messages past it",
                    fix,
                )
            )
            continue
        out.append(
            Uncovered(
                vhost,
                "queue",
                name,
                "recovery_delivery_limit",
                f"delivery limit {limit}: a message returned to it more often is {past}",
                fix,
                policy=queue.get("policy") or "",
            )
        )
    return out


def uncovered(vhost, management=None, names=None) -> list[Uncovered]:
    """The queues and exchanges of ``vhost`` Lazarus cannot collect from, with the fix; and
    Lazarus's own queues whose delivery limit is not unlimited."""
    management = management or Management()
    names = names or Names.from_settings()
    policies = management.policies(vhost) or []
    queues = management.queues(vhost) or []
    out = recovery_limits(
        vhost,
        queues,
        broker_version(management),
        names,
        policies,
        read_operator_policies(management, vhost),
    )
    for queue in queues:
        name = queue.get("name", "")
        if _ours(name, names) or queue.get("exclusive") or queue.get("auto_delete"):
            continue
        policy = _policy_for(policies, name, "queues", queue.get("type"))
        out += _queue_problems(vhost, queue, policy, names)
    for exchange in management.request("GET", f"/exchanges/{management.quote(vhost)}") or []:
        name = exchange.get("name", "")
        if _ours(name, names) or exchange.get("internal"):
            continue
        policy = _policy_for(policies, name, "exchanges")
        ae = (exchange.get("arguments") or {}).get("alternate-exchange") or (policy or {}).get(
            "definition", {}
        ).get("alternate-exchange")
        if not ae:
            out.append(
                Uncovered(
                    vhost,
                    "exchange",
                    name,
                    "no_alternate_exchange",
                    "a publish it cannot route (without mandatory) is dropped",
                    f"manage.py wire --exchanges '{re.escape(name)}' (policy {AE_POLICY})",
                )
            )
    return out


def _queue_problems(vhost, queue, policy, names) -> list[Uncovered]:
    name = queue.get("name", "")
    arguments = queue.get("arguments") or {}
    definition = queue.get("effective_policy_definition") or (policy or {}).get("definition", {})
    dlx = arguments.get("x-dead-letter-exchange") or definition.get("dead-letter-exchange")
    hiding = policy and policy.get("name") != DLX_POLICY
    if not dlx:
        fix = (
            f"manage.py wire --queues '{re.escape(name)}' (policy {DLX_POLICY}), or "
            f"x-dead-letter-exchange={names.dlx} on the queue"
        )
        if hiding:
            fix = (
                f"add dead-letter-exchange={names.dlx} to policy {policy['name']!r} "
                "(RabbitMQ applies one policy per queue: it hides Lazarus's)"
            )
        return [
            Uncovered(
                vhost,
                "queue",
                name,
                "no_dead_letter_exchange",
                "rejected, expired or overflowing messages are dropped without a trace",
                fix,
                policy=policy["name"] if hiding else "",
            )
        ]
    if dlx != names.dlx:
        return [
            Uncovered(
                vhost,
                "queue",
                name,
                "dead_letters_elsewhere",
                f"dead-letters to {dlx!r}: Lazarus does not see them",
                f"point it at {names.dlx}, or bind {dlx!r} to {names.dlx}",
            )
        ]
    strategy = arguments.get("x-dead-letter-strategy") or definition.get("dead-letter-strategy")
    # RabbitMQ quietly dead-letters at most once when at-least-once is asked for without
    # overflow reject-publish (the policy's overflow wins over the argument's).
    overflow = definition.get("overflow") or arguments.get("x-overflow") or "drop-head"
    if (
        queue.get("type") == "quorum"
        and strategy == "at-least-once"
        and overflow != ("reject-publish")
    ):
        return [
            Uncovered(
                vhost,
                "queue",
                name,
                "dead_letters_at_most_once",
                f"dead-letter-strategy at-least-once with overflow {overflow}: RabbitMQ "
                "dead-letters at most once unless overflow is reject-publish",
                f"manage.py wire --queues '{re.escape(name)}' --at-least-once "
                "(dead-letter-strategy at-least-once, overflow reject-publish)",
            )
        ]
    if queue.get("type") == "quorum" and strategy != "at-least-once":
        return [
            Uncovered(
                vhost,
                "queue",
                name,
                "dead_letters_at_most_once",
                "a quorum queue dead-letters at most once by default: a message dead-lettered "
                "while a node is lost is gone",
                f"manage.py wire --queues '{re.escape(name)}' --at-least-once "
                "(dead-letter-strategy at-least-once, overflow reject-publish)",
            )
        ]
    return []


def uncovered_everywhere(management=None) -> tuple[list[Uncovered], list[str]]:
    """``uncovered`` over every watched vhost; (rows, vhosts it could not look at)."""
    management = management or Management()
    rows, unreachable = [], []
    for vhost in settings.RECOVERY_VHOSTS:
        try:
            rows += uncovered(vhost, management)
        except Exception as exc:  # noqa: BLE001 - a vhost it cannot see is reported, not skipped
            unreachable.append(f"{vhost}: {exc}")
    return rows, unreachable
