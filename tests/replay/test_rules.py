"""Pure rules, no services: the breaker and canary verdicts, the pacer, delay names, targets."""

import pytest
from django.core.exceptions import ValidationError

from recovery.replay.pacer import Pacer
from recovery.replay.safety import breaker_reason, canary_reason
from recovery.replay.targets import Target, delay_label, delay_name, validate_target


def test_the_breaker_waits_for_a_sample_then_trips_at_the_threshold():
    assert breaker_reason(replayed=19, dead=19, threshold_pct=50, min_sample=20) is None
    assert breaker_reason(replayed=40, dead=19, threshold_pct=50, min_sample=20) is None
    reason = breaker_reason(replayed=40, dead=20, threshold_pct=50, min_sample=20)
    assert reason.startswith("circuit breaker: 20 of 40 replayed messages (50%)")
    assert breaker_reason(replayed=400, dead=400, threshold_pct=0, min_sample=20) is None


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
