"""The firehose's cost (#48), in one run on a private vhost:

1. the broker's publish rate (async confirms, window 1000, 1 KiB persistent messages) and
   consume rate (manual multiple-ack) with tracing on against off, alternating rounds;
2. the tap (``recovery.broker.trace_tap.Tap``: records, Parquet by hour, fsync, offsets) draining
   the trace queue those rounds filled, against a raw pika consumer of the same queue.

    .venv/bin/python bench/firehose.py [N] [--rounds 3]

Baselines: ``baselines/broker_baseline.py``'s ``async_confirm`` and ``consume`` (tracing off is
the broker's own limit here). Prints per round and the median and best of each ratio.
"""

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent / "baselines"))

from _vhost import private_vhost  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("n", nargs="?", type=int, default=20_000, help="messages per round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with private_vhost("lazarus-bench-firehose") as url:
        os.environ["RABBITMQ_URL"] = url
        from _django import setup_django

        setup_django("lazarus_bench_firehose", RABBITMQ_URL=url)
        import broker_baseline
        import pika
        from django.conf import settings

        from recovery.broker.trace import set_tracing, wire_trace
        from recovery.broker.trace_tap import Tap

        broker_baseline.params = pika.URLParameters(url)
        vhost = pika.URLParameters(url).virtual_host
        settings.RECOVERY_VHOSTS = [vhost]
        wire_trace(vhost, True)
        queue = settings.RECOVERY_TRACE_QUEUE
        publish, consume, tap = [], [], []
        work = Path(tempfile.mkdtemp(prefix="lazarus-bench-trace-"))
        try:
            for round_number in range(1, args.rounds + 1):

                def pass_with(on):
                    return traced_pass(broker_baseline, set_tracing, vhost, args.n, on)

                rates = {}
                for on in (False, True) if round_number % 2 else (True, False):
                    rates[on] = pass_with(on)
                publish.append(rates[True][0] / rates[False][0])
                consume.append(rates[True][1] / rates[False][1])
                # The trace queue now holds the traced pass's publishes and deliveries (2N);
                # each drainer gets such a fill, the one going first alternating.
                traced, drained = 2 * args.n, {}
                order = ("tap", "raw") if round_number % 2 else ("raw", "tap")
                for n, drainer in enumerate(order):
                    if n:
                        pass_with(True)
                    if drainer == "tap":
                        base = work / f"r{round_number}"
                        drained["tap"] = drain_with_tap(Tap, vhost, base, traced)
                    else:
                        drained["raw"] = broker_baseline.consume(queue, traced, prefetch=2000)[0]
                tap.append(drained["tap"] / drained["raw"])
                print(
                    f"round {round_number}: publish off {rates[False][0]:,.0f} on "
                    f"{rates[True][0]:,.0f} msg/s ({publish[-1]:.2f}); consume off "
                    f"{rates[False][1]:,.0f} on {rates[True][1]:,.0f} msg/s ({consume[-1]:.2f}); "
                    f"tap {drained['tap']:,.0f} against raw {drained['raw']:,.0f} records/s "
                    f"({tap[-1]:.2f})"
                )
        finally:
            set_tracing(vhost, False)
        for name, ratios in (
            ("publish, tracing on / off", publish),
            ("consume, tracing on / off", consume),
            ("tap / raw consumer of the trace queue", tap),
        ):
            print(
                f"{name}: median {statistics.median(ratios):.2f}, best {max(ratios):.2f} "
                f"of {len(ratios)} rounds"
            )


def traced_pass(broker_baseline, set_tracing, vhost, n, on):
    """(publish msg/s, consume msg/s) of ``n`` messages with tracing ``on`` (off after)."""
    set_tracing(vhost, on)
    sent, queue = broker_baseline.async_confirm(n)
    got, _ = broker_baseline.consume(queue, n)
    set_tracing(vhost, False)
    return sent, got


def drain_with_tap(tap_class, vhost, base, expected):
    """Records/s of a Tap draining ``expected`` trace messages into ``base``."""
    tap = tap_class(vhost, base=str(base), flush_seconds=1.0)
    stop = threading.Event()
    thread = threading.Thread(target=tap.run, args=(stop,), daemon=True)
    started = time.perf_counter()
    thread.start()
    deadline = time.monotonic() + 600
    while tap.records < expected and time.monotonic() < deadline:
        time.sleep(0.05)
    seconds = time.perf_counter() - started
    stop.set()
    thread.join(30)
    if tap.records < expected:
        raise RuntimeError(f"the tap wrote {tap.records} of {expected} records in 600 s")
    return tap.records / seconds


if __name__ == "__main__":
    main()
