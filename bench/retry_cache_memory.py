"""Peak RSS while ReliablePublisher sends many messages: the retry cache must stay flat.

The seeds' RetryCache was checked by sending 150M messages and watching memory hold at 900 MB.
Here the cache is bounded by the window, so RSS at 10 %, 50 % and 100 % of the run should be the
same within noise. The target queue keeps only the newest MAX_LENGTH messages so the broker does
not have to hold the whole run.

Usage: python bench/retry_cache_memory.py [N]   (default 1,000,000)
"""

import argparse
import os
import resource
import sys
import tempfile
import time

import pika

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._vhost import private_vhost  # noqa: E402
from recovery.client import ReliablePublisher  # noqa: E402

BODY = b"x" * 1024
MAX_LENGTH = 10_000


def rss_mb():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def peak_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "n", type=int, nargs="?", default=1_000_000, help="messages (default %(default)s)"
    )
    n = parser.parse_args().n
    checkpoints = {n // 10: "10%", n // 2: "50%", n: "100%"}
    with private_vhost("lazarus-bench-memory") as url, tempfile.TemporaryDirectory() as logs:
        connection = pika.BlockingConnection(pika.URLParameters(url))
        connection.channel().queue_declare(
            "bench.memory", durable=True, arguments={"x-max-length": MAX_LENGTH}
        )
        connection.close()
        publisher = ReliablePublisher(url, producer="bench-memory", log_dir=logs)
        print(f"start: RSS {rss_mb():.1f} MB")
        started = time.perf_counter()
        for i in range(1, n + 1):
            publisher.publish("", "bench.memory", BODY)
            if i in checkpoints:
                print(
                    f"{checkpoints[i]:>4} ({i} sent): RSS {rss_mb():.1f} MB, "
                    f"peak {peak_mb():.1f} MB, owned {publisher.owned}"
                )
        publisher.flush()
        rate = n / (time.perf_counter() - started)
        publisher.close()
    print(f"done: {rate:.0f} msg/s, peak RSS {peak_mb():.1f} MB")


if __name__ == "__main__":
    main()
