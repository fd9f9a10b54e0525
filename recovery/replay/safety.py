"""The two judgments that stop a bulk replay from making an outage worse. Pure functions of
counts (the runner gathers them), so each rule is stated, and tested, in one place.

"Came back" means: a replayed message was dead-lettered again and collected, with ``origin``
pointing at the row it was replayed from (the ``x-recovery-origin`` header).
"""


def breaker_reason(replayed, dead, threshold_pct, min_sample):
    """Why the circuit breaker trips, or None.

    ``replayed`` and ``dead`` count since the job started or was last resumed. It judges the
    share that came back once ``min_sample`` were replayed (a few early deaths are noise) and
    trips when it reaches ``threshold_pct``; a threshold of 0 or None turns it off.

    Before the sample is full it trips as soon as the verdict on the sample is certain: when
    ``dead`` alone is ``threshold_pct`` % of ``min_sample``, the share at ``min_sample`` can no
    longer fall below the threshold, even if every other message of the sample is consumed
    fine (a death is never taken back). No statistics, no guess: the same verdict, sooner. A
    job whose consumer rejects everything at a threshold of 50 % pauses at the 10th death
    instead of sending on until the 20th replay and waiting for its deaths to be collected.
    """
    if not threshold_pct:
        return None
    # Deaths of messages replayed before a resume can be collected after it and land in the
    # new count (the counts cannot tell them apart): never more deaths than the sample holds.
    dead = min(dead, replayed)
    if replayed >= min_sample:
        share = 100.0 * dead / replayed
        if share < threshold_pct:
            return None
        return (
            f"circuit breaker: {dead} of {replayed} replayed messages ({share:.0f}%) came back "
            f"dead-lettered; threshold {threshold_pct:g}%. Fix the consumer, then resume."
        )
    if not dead or dead < deaths_to_trip_early(threshold_pct, min_sample):
        return None
    share = 100.0 * dead / replayed
    return (
        f"circuit breaker: {dead} of {replayed} replayed messages ({share:.0f}%) came back "
        f"dead-lettered before the sample of {min_sample} was full; even if the other "
        f"{min_sample - replayed} come back fine, that is {100.0 * dead / min_sample:.0f}% of "
        f"the sample; threshold {threshold_pct:g}%. Fix the consumer, then resume."
    )


def deaths_to_trip_early(threshold_pct, min_sample):
    """The fewest deaths that make the breaker's verdict on its sample certain: the smallest
    ``k`` with ``k / min_sample >= threshold_pct %`` (compared as breaker_reason compares)."""
    needed = int(threshold_pct * min_sample // 100)
    while 100 * needed < threshold_pct * min_sample:
        needed += 1
    return needed


def breaker_state(replayed, dead, threshold_pct, min_sample, since="since the start"):
    """The breaker as people read it while a job runs: a dict of its numbers and ``summary``.

    ``phase`` is ``off``, ``judging`` (fewer than ``min_sample`` replays since ``since``: it can
    trip only early, see breaker_reason), ``watching`` (the share is judged at every check) or
    ``tripped`` (the rule says pause; the job's ``state_reason`` says why).
    """
    state = {
        "phase": "off",
        "threshold_pct": threshold_pct or None,
        "min_sample": min_sample,
        "replayed": max(replayed, 0),
        "came_back": max(min(dead, replayed), 0),
        "share_pct": None,
        "trips_early_at": None,
        "reason": None,
        "summary": "circuit breaker off",
    }
    if not threshold_pct:
        return state
    replayed, dead = state["replayed"], state["came_back"]
    early = deaths_to_trip_early(threshold_pct, min_sample)
    state["trips_early_at"] = early
    share = 100.0 * dead / replayed if replayed else None
    state["share_pct"] = round(share, 1) if share is not None else None
    counts = (
        f"{dead} of {replayed} came back ({share:.0f} %)" if replayed else "nothing replayed yet"
    )
    reason = breaker_reason(replayed, dead, threshold_pct, min_sample)
    if reason is not None:
        state.update(phase="tripped", reason=reason)
        state["summary"] = f"circuit breaker tripped at {threshold_pct:g} %: {counts}"
    elif replayed < min_sample:
        state["phase"] = "judging"
        so_far = (
            f"{replayed} {since}, {dead} came back ({share:.0f} %)"
            if replayed
            else f"none replayed {since} yet"
        )
        state["summary"] = (
            f"circuit breaker: judging after {min_sample} replays; {so_far}. "
            f"Pauses at {threshold_pct:g} %, or as soon as {early} have come back"
        )
    else:
        state["phase"] = "watching"
        state["summary"] = f"circuit breaker at {threshold_pct:g} %: {counts}"
    return state


def job_breaker(job, min_sample):
    """breaker_state for a ReplayJob, from the counts its runner writes (``confirmed``, and
    ``dead_again``, which the runner refreshes every BREAKER_CHECK_S while the breaker is on),
    counted from the base a resume moves up."""
    since = "since the last resume" if job.breaker_base_confirmed else "since the start"
    return breaker_state(
        job.confirmed - job.breaker_base_confirmed,
        job.dead_again - job.breaker_base_dead,
        job.breaker_threshold_pct,
        min_sample,
        since,
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
