"""Which consumer groups each (exchange, routing key) is expected to reach, and when.

An ``Expectation`` comes from the bindings history, the configuration (``AUDIT_BINDINGS``) or
the consumer logs themselves (``observed``); ``key_expectations`` turns them into time spans
per producer key, each with the bitmask of the groups expected then (``WORD_BITS`` per long).
Definitions: the docstring of ``spark/transforms.py`` ("expected group").
"""

import re
from dataclasses import dataclass

from spark.schema import HOUR_MS, topic_pattern_regex

# A set of bound groups is a bitmask of ``LogFacts.words`` longs, 63 bits each: never negative,
# so ``x & -x`` (the lowest bit) cannot overflow.
WORD_BITS = 63

# Unbounded ends of an expectation's time span (epoch ms), far from any real timestamp.
SPAN_START, SPAN_END = -(1 << 62), 1 << 62
# Which source an expectation came from, strongest first: a lost pair's evidence shows the
# strongest that expected it. ``traced``: the broker's own ``routed_queues`` (spark/trace_facts.py),
# which replace every other source's expectations of a key it traced.
SOURCES = ("traced", "configured", "bound", "observed")


@dataclass(frozen=True)
class Expectation:
    """A consumer group expected to receive (exchange, routing key) messages first published in
    [from_ms, until_ms): from a binding (``bound``: the bindings history or a snapshot),
    ``AUDIT_BINDINGS`` (``configured``) or the consumer logs (``observed``, an exact key)."""

    exchange: str
    pattern: str
    consumer_group: str
    queue: str | None = None
    source: str = "bound"
    from_ms: int = SPAN_START
    until_ms: int = SPAN_END
    exact: bool = False

    @classmethod
    def from_binding(cls, entry: dict) -> "Expectation":
        """A bindings entry: ``exchange``, ``routing_key`` (topic pattern), ``consumer_group``,
        optional ``queue``, ``source`` (bound | configured), ``from_ms``/``until_ms`` (null:
        unbounded)."""
        source = entry.get("source") or "bound"
        if source not in SOURCES:
            raise ValueError(f"unknown expectation source {source!r}")
        from_ms, until_ms = entry.get("from_ms"), entry.get("until_ms")
        return cls(
            exchange=entry["exchange"],
            pattern=entry["routing_key"],
            consumer_group=entry["consumer_group"],
            queue=entry.get("queue"),
            source=source,
            from_ms=SPAN_START if from_ms is None else int(from_ms),
            until_ms=SPAN_END if until_ms is None else int(until_ms),
        )

    def matcher(self):
        if self.exact:
            return lambda key: key == self.pattern
        return re.compile(topic_pattern_regex(self.pattern)).fullmatch


def observed_expectations(spans) -> list[Expectation]:
    """(exchange, routing_key, consumer_group, first window, last window) of the consumptions
    of keys a group was never bound to -> ``observed`` expectations from the first window's
    start to the last one's end (the metric definitions: transforms.py "expected group")."""
    return [
        Expectation(exchange, key, group, None, "observed", first, last + HOUR_MS, exact=True)
        for exchange, key, group, first, last in spans
    ]


def segments(spans) -> list[tuple[int, int, frozenset]]:
    """[(group, from, until)] -> [(from, until, groups)]: the time split where the set of
    groups changes, adjacent pieces with equal sets merged, empty sets left out."""
    cuts = sorted({SPAN_START, SPAN_END} | {f for _, f, _ in spans} | {u for _, _, u in spans})
    out = []
    for lo, hi in zip(cuts, cuts[1:], strict=False):
        groups = frozenset(g for g, f, u in spans if f <= lo and hi <= u)
        if out and out[-1][2] == groups and out[-1][1] == lo:
            out[-1] = (out[-1][0], hi, groups)
        else:
            out.append((lo, hi, groups))
    return [s for s in out if s[2]]


def key_expectations(producer, every: list[Expectation], bit_groups: list[str], words: int):
    """Per producer key: (keys, expectations, provenance, spans_of) of ``LogFacts`` (spans_of:
    (exchange, routing_key) -> [(group, from, until)])."""
    bit = {group: i for i, group in enumerate(bit_groups)}
    matchers = [(e, e.matcher()) for e in every]

    def mask(groups) -> list[int]:
        words_ = [0] * words
        for group in groups:
            words_[bit[group] // WORD_BITS] |= 1 << (bit[group] % WORD_BITS)
        return words_

    keys, expectations, provenance, spans_of = [], [], [], {}
    for (exchange, routing_key), hashed in sorted(
        {(r.exchange, r.routing_key): r.key_hash for r in producer}.items()
    ):
        keys.append((hashed, exchange, routing_key))
        applying = [e for e, m in matchers if e.exchange == exchange and m(routing_key)]
        if any(e.source == "traced" for e in applying):  # the broker named the queues
            applying = [e for e in applying if e.source == "traced"]
        spans = [(e.consumer_group, e.from_ms, e.until_ms) for e in applying]
        spans_of[(exchange, routing_key)] = spans
        anybound = mask({e.consumer_group for e in applying if e.source != "observed"})
        for lo, hi, groups in segments(spans):
            expectations.append((hashed, lo, hi, *mask(groups), *anybound))
        if not spans and any(anybound):
            expectations.append((hashed, SPAN_START, SPAN_END, *([0] * words), *anybound))
        provenance += sorted(
            {
                (exchange, routing_key, e.consumer_group, e.from_ms, e.until_ms, e.source)
                for e in applying
            }
        )
    return keys, expectations, provenance, spans_of


def trace_differences(keys, every: list[Expectation]) -> list[tuple]:
    """(exchange, routing_key, consumer_group, "bound, not routed" | "routed, not bound") for
    every traced key whose groups the bindings or the configuration name differently from the
    broker's routing (a warning: the broker's word is the one the audit takes)."""
    traced = [e for e in every if e.source == "traced"]
    named = [(e, e.matcher()) for e in every if e.source in ("bound", "configured")]
    out = set()
    for _, exchange, routing_key in keys:
        routed = {
            e.consumer_group for e in traced if e.exchange == exchange and e.pattern == routing_key
        }
        if not routed:
            continue
        bound = {e.consumer_group for e, m in named if e.exchange == exchange and m(routing_key)}
        if not bound:
            continue  # no binding history to check against
        out |= {(exchange, routing_key, g, "bound, not routed") for g in bound - routed}
        out |= {
            (exchange, routing_key, g, "routed, not bound")
            for g in routed - bound
            if not g.startswith("(")
        }
    return sorted(out)
