"""The two judgments that stop a bulk replay from making an outage worse. Pure functions of
counts (the runner gathers them), so each rule is stated, and tested, in one place.

"Came back" means: a replayed message was dead-lettered again and collected, with ``origin``
pointing at the row it was replayed from (the ``x-recovery-origin`` header).
"""


def breaker_reason(replayed, dead, threshold_pct, min_sample):
    """Why the circuit breaker trips, or None.

    ``replayed`` and ``dead`` count since the job started or was last resumed. It judges only
    after ``min_sample`` replays (a few early deaths are noise) and trips when the share that came
    back reaches ``threshold_pct``; a threshold of 0 or None turns it off.
    """
    if not threshold_pct or replayed < min_sample:
        return None
    share = 100.0 * dead / replayed
    if share < threshold_pct:
        return None
    return (
        f"circuit breaker: {dead} of {replayed} replayed messages ({share:.0f}%) came back "
        f"dead-lettered; threshold {threshold_pct:g}%. Fix the consumer, then resume."
    )


def canary_reason(item_counts, dead, max_failure_pct, pause_seconds):
    """Why the canary fails, or None if the job may go on.

    ``item_counts``: the canary items by state; ``dead``: how many of the confirmed ones came
    back. It passes only if fewer than ``max_failure_pct`` % came back; a canary the broker did
    not accept at all (every message returned or refused) fails too.
    """
    confirmed = item_counts.get("confirmed", 0)
    refused = sum(item_counts.get(state, 0) for state in ("returned", "nacked", "failed"))
    if confirmed == 0 and refused:
        return (
            f"canary: none of the {refused} canary messages was accepted by the broker "
            "(returned or refused; see the attempts)."
        )
    share = 100.0 * dead / confirmed if confirmed else 0.0
    if max_failure_pct is not None and share >= max_failure_pct:
        return (
            f"canary: {dead} of {confirmed} canary messages ({share:.0f}%) came back "
            f"dead-lettered within {pause_seconds:g}s (limit: fewer than {max_failure_pct:g}%). "
            "Resume to continue anyway."
        )
    return None
