"""What the nightly audit reads of the broker's trace (#48): where the tap's records are, the
trace_gaps over the day, and Lazarus's own queues (spark/trace_facts.py ignores them).

The gaps come from the tap's coverage records (``recovery.broker.trace.coverage_gaps``), per
vhost the tap ever covered, over the hours the audit reads (the producer look-back to the
grace after the day), up to the moment the audit runs: coverage can only be asked of the
past. The time before a vhost's first coverage record is no gap: the trace queue is declared
before tracing is turned on (``wire --trace on``), so a tap's first start reads every trace
message since, and before it no record exists to be incomplete.

A message routed to a queue and never delivered is lost only if it is no longer in the queue.
The firehose cannot say which messages a queue still holds, so a queue of a traced vhost that
holds any message when the audit runs is, where the audit finds its group traced, a ``queued``
gap of that group over the whole span the audit reads: its undelivered messages are
``unverified`` (some of them may still be there), never lost (``queued``, beside ``gaps``).
Where the management API cannot say, every traced group is (``queues_unknown``).
"""

import datetime

from django.conf import settings

from recovery.broker import trace
from recovery.broker.management import Management
from recovery.broker.topology import declared_counts


def own_queues():
    return sorted(
        {
            settings.RECOVERY_DEAD_LETTER_QUEUE,
            settings.RECOVERY_UNROUTED,
            settings.RECOVERY_RETURNS_QUEUE,
            settings.RECOVERY_QUARANTINE_QUEUE,
            settings.RECOVERY_PARKED,
            settings.RECOVERY_TRACE_QUEUE,
        }
    )


def queued_gaps(vhosts, from_ms, until_ms, management=None):
    """A ``queued`` gap per queue of ``vhosts`` (Lazarus's own aside) holding messages now; one
    ``queues_unknown`` gap per vhost whose queues the management API would not list."""
    management = management or Management()
    own = set(own_queues())
    gaps = []
    for vhost in vhosts:
        try:
            listed = [q for q in management.queues(vhost) or [] if q["name"] not in own]
            # The management API's counts lag by its statistics interval (a new queue shows
            # none for seconds): a passive declare's are exact (ready messages only; the
            # API's, when given, include the unacknowledged ones).
            exact = declared_counts(vhost, [q["name"] for q in listed])
        except Exception as exc:  # noqa: BLE001 - said as a gap, never as "empty"
            gaps.append(
                {
                    "kind": "queues_unknown",
                    "node": None,
                    "vhost": vhost,
                    "from_ms": from_ms,
                    "until_ms": until_ms,
                    "error": str(exc)[:200],
                }
            )
            continue
        for q in listed:
            messages = max((exact.get(q["name"]) or (0, 0))[0], q.get("messages") or 0)
            if messages:
                gaps.append(
                    {
                        "kind": "queued",
                        "node": None,
                        "vhost": vhost,
                        "queue": q["name"],
                        "messages": messages,
                        "from_ms": from_ms,
                        "until_ms": until_ms,
                    }
                )
    return gaps


def trace_input(day, grace, base=None):
    """(the audit's ``trace`` dict, warnings) for the UTC ``day``; (None, []) when the tap never
    wrote anything there."""
    root = trace.root(base)
    if not root.exists() or not any(root.glob("dt=*/hour=*/*.parquet")):
        return None, []
    start = datetime.datetime(day.year, day.month, day.day, tzinfo=datetime.UTC)
    hours = max(1, -(-int(grace.total_seconds()) // 3600))
    from_ms = int((start - datetime.timedelta(hours=hours)).timestamp() * 1000)
    until_ms = min(
        int((start + datetime.timedelta(days=1) + grace).timestamp() * 1000), trace.now_ms()
    )
    coverage = trace.read_coverage(root)
    # Two flush periods between a tap's spans, and at least 10 s: an audit asks at most a few
    # seconds after a running tap's last flush, and a pause that short loses nothing.
    slack_ms = max(int(settings.TRACE_FLUSH_SECONDS * 2000), 10_000)
    gaps = []
    for vhost in sorted({row["vhost"] for row in coverage}):
        first = min(row["from_ms"] for row in coverage if row["vhost"] == vhost)
        if max(from_ms, first) < until_ms:
            gaps += [
                {**gap, "vhost": vhost}
                for gap in trace.coverage_gaps(vhost, max(from_ms, first), until_ms, root, slack_ms)
            ]
    # Which of these queues the trace routed to is the audit's to know: it keeps those of its
    # traced groups (spark/log_facts.py trace_gap_rows); only they are gaps and warnings.
    queued = queued_gaps(sorted({row["vhost"] for row in coverage}), from_ms, until_ms)
    gaps += [g for g in queued if g["kind"] == "queues_unknown"]
    queued = [g for g in queued if g["kind"] == "queued"]
    if not coverage:  # records and no coverage at all: nothing says they are complete
        gaps.append(
            {
                "kind": "uncovered",
                "node": None,
                "vhost": None,
                "from_ms": from_ms,
                "until_ms": until_ms,
            }
        )
    warnings = [{"code": "trace_gap", "count": len(gaps)}] if gaps else []
    trace_dict = {"path": str(root), "gaps": gaps, "queued": queued, "ignored_queues": own_queues()}
    return trace_dict, warnings
