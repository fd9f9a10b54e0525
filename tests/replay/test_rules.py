"""Pure rules, no services: the breaker and canary verdicts, the pacer, delay names, targets."""

import pytest
from django.core.exceptions import ValidationError

from recovery.replay.pacer import Pacer
from recovery.replay.safety import (
    breaker_reason,
    breaker_state,
    canary_reason,
    deaths_to_trip_early,
)
from recovery.replay.targets import Target, delay_label, delay_name, validate_target


def test_the_breaker_waits_for_a_sample_then_trips_at_the_threshold():
    assert breaker_reason(replayed=19, dead=9, threshold_pct=50, min_sample=20) is None
    assert breaker_reason(replayed=40, dead=19, threshold_pct=50, min_sample=20) is None
    reason = breaker_reason(replayed=40, dead=20, threshold_pct=50, min_sample=20)
    assert reason.startswith("circuit breaker: 20 of 40 replayed messages (50%)")
    assert breaker_reason(replayed=400, dead=400, threshold_pct=0, min_sample=20) is None


def test_the_breaker_trips_before_its_sample_once_the_verdict_is_certain():
    # The reported job: 14 of 17 came back at a 50 % threshold and a sample of 20, and it ran
    # on. 10 deaths are 50 % of 20 whatever the other replays of the sample do.
    assert breaker_reason(replayed=12, dead=9, threshold_pct=50, min_sample=20) is None
    reason = breaker_reason(replayed=12, dead=10, threshold_pct=50, min_sample=20)
    assert reason == (
        "circuit breaker: 10 of 12 replayed messages (83%) came back dead-lettered before the "
        "sample of 20 was full; even if the other 8 come back fine, that is 50% of the sample; "
        "threshold 50%. Fix the consumer, then resume."
    )
    assert breaker_reason(replayed=17, dead=14, threshold_pct=50, min_sample=20) is not None
    assert deaths_to_trip_early(50, 20) == 10
    assert deaths_to_trip_early(33.3, 20) == 7  # 6 of 20 is 30 %, 7 is 35 %
    assert deaths_to_trip_early(100, 20) == 20  # never before the sample is full


@pytest.mark.parametrize("threshold", [0.5, 10, 12.5, 33.3, 50, 66.7, 99.9, 100])
def test_the_early_trip_is_exactly_the_certain_verdict(threshold):
    """Every (replayed, came back) before the sample is full: it trips early if and only if
    the full rule would trip at the sample however the rest of it turns out (deaths only
    grow, so the least it can be is what came back already)."""
    for sample in range(1, 21):
        for replayed in range(sample):
            for dead in range(replayed + 1):
                early = breaker_reason(replayed, dead, threshold, sample) is not None
                outcomes = [
                    breaker_reason(sample, dead + more, threshold, sample) is not None
                    for more in range(sample - replayed + 1)
                ]
                assert early == all(outcomes), (threshold, sample, replayed, dead)


def test_deaths_from_before_a_resume_never_outnumber_the_new_sample():
    # Replays sent just before a breaker pause can come back after the resume moved the base.
    assert breaker_reason(replayed=0, dead=12, threshold_pct=50, min_sample=20) is None
    assert breaker_reason(replayed=3, dead=12, threshold_pct=50, min_sample=20) is None
    assert breaker_state(3, 12, 50, 20)["came_back"] == 3


def test_the_breaker_state_reads_as_words():
    assert breaker_state(12, 9, 50, 20, "since the canary")["summary"] == (
        "circuit breaker: judging after 20 replays; 12 since the canary, 9 came back (75 %). "
        "Pauses at 50 %, or as soon as 10 have come back"
    )
    assert breaker_state(0, 0, 50, 20)["summary"] == (
        "circuit breaker: judging after 20 replays; none replayed since the start yet. "
        "Pauses at 50 %, or as soon as 10 have come back"
    )
    watching = breaker_state(25, 3, 50, 20)
    assert watching["summary"] == "circuit breaker at 50 %: 3 of 25 came back (12 %)"
    assert (watching["phase"], watching["share_pct"], watching["reason"]) == (
        "watching",
        12.0,
        None,
    )
    tripped = breaker_state(13, 10, 50, 20)
    assert tripped["phase"] == "tripped"
    assert tripped["summary"] == "circuit breaker tripped at 50 %: 10 of 13 came back (77 %)"
    assert tripped["reason"] == breaker_reason(13, 10, 50, 20)
    off = breaker_state(40, 40, None, 20)
    assert (off["phase"], off["summary"], off["threshold_pct"]) == (
        "off",
        "circuit breaker off",
        None,
    )


def test_the_canary_passes_only_below_its_limit():
    assert canary_reason({"confirmed": 10}, 0, 10, 5) is None
    assert canary_reason({"confirmed": 10}, 1, 20, 5) is None
    assert canary_reason({"confirmed": 10}, 1, 10, 5).startswith("canary: 1 of 10")
    assert "none of the 3" in canary_reason({"returned": 2, "failed": 1}, 0, 10, 5)
    assert canary_reason({"skipped": 4}, 0, 10, 5) is None  # nothing to judge


def test_the_pacer_keeps_the_rate_without_bursting_after_a_pause():
    pacer = Pacer(100)
    start = pacer.last
    assert pacer.allowance(start + 0.1, 1000) == 10
    assert pacer.allowance(start + 0.1, 1000) == 0
    assert pacer.allowance(start + 60, 1000) == 50  # at most half a second of tokens
    assert Pacer(None).allowance(start, 1234) == 1234


def test_delay_queue_names(settings):
    settings.REPLAY_DELAY_PREFIX = "recovery.delay"
    assert [delay_label(s) for s in (10, 60, 600, 90, 3600)] == ["10s", "1m", "10m", "90s", "1h"]
    assert delay_name(60) == "recovery.delay.1m"
    assert delay_name(60, "orders") == "recovery.delay.1m.to.orders"


def test_targets():
    dead = ("dead_letter", "orders.q", "orders", ["order.created"])
    unroutable = ("unroutable", "", "orders", ["order.created"])
    assert Target().final(*dead) == ("", "orders.q")
    assert Target().final(*unroutable) == ("orders", "order.created")
    assert Target(queue="retry.q").final(*dead) == ("", "retry.q")
    assert validate_target(routing_key="q").final(*dead) == ("", "q")
    assert Target(delay_seconds=10).route("", "orders.q") == ("recovery.delay.10s", "orders.q")
    with pytest.raises(ValidationError):
        validate_target(exchange="x" * 256)
