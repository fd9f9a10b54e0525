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
from recovery.broker.topology import AE_POLICY, DLX_POLICY, Names


@dataclass(frozen=True)
class Uncovered:
    vhost: str
    kind: str  # queue | exchange
    name: str
    problem: str  # no_dead_letter_exchange | dead_letters_elsewhere | no_alternate_exchange
    detail: str
    fix: str
    policy: str = ""  # the queue's own policy that hides Lazarus's, if any

    def as_dict(self):
        return asdict(self)


def _ours(name, names):
    own = {names.dlx, names.dead_letters, names.unrouted, names.returns, names.quarantine}
    return (
        name in own
        or name.startswith(("amq.", "recovery.", "lazarus-", settings.REPLAY_DELAY_PREFIX + "."))
        or name == ""
    )


def _policy_for(policies, name, applies_to):
    """The policy RabbitMQ applies to ``name``: the highest priority whose pattern matches."""
    matching = [
        p
        for p in policies
        if p.get("apply-to") in (applies_to, "all") and re.search(p.get("pattern", ""), name)
    ]
    return max(matching, key=lambda p: p.get("priority", 0), default=None)


def uncovered(vhost, management=None, names=None) -> list[Uncovered]:
    """The queues and exchanges of ``vhost`` Lazarus cannot collect from, with the fix."""
    management = management or Management()
    names = names or Names.from_settings()
    policies = management.policies(vhost) or []
    out = []
    for queue in management.queues(vhost) or []:
        name = queue.get("name", "")
        if _ours(name, names) or queue.get("exclusive") or queue.get("auto_delete"):
            continue
        out += _queue_problems(vhost, queue, _policy_for(policies, name, "queues"), names)
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
