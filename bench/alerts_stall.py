"""Alert evaluation keeps its schedule while every receiver stalls (issue #29).

    .venv/bin/python bench/alerts_stall.py [--seconds 120] [--receivers 10] [--stall 60]

Starts RECEIVERS local HTTP receivers that accept a notification and then stall: they send a
status line and one header every few seconds for STALL seconds (a per-read timeout never fires;
only a wall-clock deadline ends the send). A rule that fires on one open message, reminding every
10 s, notifies all of them through webhook channels, so the outbox always has sends stalled at
their deadline (ALERTS_SEND_DEADLINE_SECONDS, 10 s). Real processes run it as `make run` does:
celery beat (evaluation every ALERTS_EVALUATE_SECONDS = 5 s), a worker for the task queues and
one for the alerts queue (`lazarus.alerts`, delivery only).

For SECONDS it samples the rule's ``last_evaluated_at`` every 0.25 s and prints the longest gap
between two evaluations against the interval: ``max gap / interval`` (1.0 is on schedule; the
issue asks for no more than one interval late, ≤ 2.0). Then the same with one worker for both
queues (how it ran before delivery had its own worker) as the contrast. It also prints what the
receivers saw (attempts arriving) and what the outbox says.

Runs in a private vhost and database (BENCH_DATABASE_URL, default
``postgresql://postgres@127.0.0.1:5432/lazarus_bench_alerts``). Prints; never asserts.
"""

import argparse
import datetime
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench._django import setup_django  # noqa: E402

BENCH_DB = setup_django("lazarus_bench_alerts")

import psycopg  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.utils import timezone  # noqa: E402

from bench._vhost import private_vhost  # noqa: E402
from recovery.models import (  # noqa: E402
    AlertRule,
    Message,
    Notification,
    NotificationChannel,
)

EVALUATE_SECONDS = 5


def ensure_database():
    admin = BENCH_DB.rsplit("/", 1)[0] + "/postgres"
    name = BENCH_DB.rsplit("/", 1)[1]
    with psycopg.connect(admin, autocommit=True) as pg:
        if not pg.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            pg.execute(f'CREATE DATABASE "{name}"')
    call_command("migrate", verbosity=0)


class StallingReceiver:
    """Accepts connections; to each, after reading the request, a status line and then a header
    line every ``drip`` seconds for ``stall`` seconds. Counts the connections (attempts)."""

    def __init__(self, stall, drip=3.0):
        self.stall, self.drip = stall, drip
        self.attempts = 0
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.stopped = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        self.server.settimeout(0.5)
        while not self.stopped.is_set():
            try:
                conn, _ = self.server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.attempts += 1
            threading.Thread(target=self._stall, args=(conn,), daemon=True).start()

    def _stall(self, conn):
        try:
            conn.settimeout(5)
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\n")
            ends = time.monotonic() + self.stall
            n = 0
            while time.monotonic() < ends and not self.stopped.is_set():
                time.sleep(self.drip)
                n += 1
                conn.sendall(f"X-Drip-{n}: still here\r\n".encode())
        except OSError:
            pass
        finally:
            conn.close()

    def close(self):
        self.stopped.set()
        self.server.close()


def celery(args, env, log):
    return subprocess.Popen(
        [str(ROOT / ".venv/bin/celery"), "-A", "console", *args],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def stop(processes):
    for process in processes:
        process.terminate()
    for process in processes:
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def run_layout(name, separate, amqp_url, args, workdir):
    """One measurement: fresh rule, channels and receivers; the processes; the samples."""
    Notification.objects.all().delete()
    AlertRule.objects.all().delete()
    NotificationChannel.objects.all().delete()
    receivers = [StallingReceiver(args.stall) for _ in range(args.receivers)]
    channels = [
        NotificationChannel.objects.create(
            name=f"stalling-{i}", kind="webhook", target=f"http://127.0.0.1:{r.port}/hook"
        )
        for i, r in enumerate(receivers)
    ]
    rule = AlertRule.objects.create(
        name="one open message",
        kind="open_messages",
        params={"threshold": 0},
        remind_every=datetime.timedelta(seconds=10),
    )
    rule.channels.set(channels)
    vhost = amqp_url.rsplit("/", 1)[1]
    env = {
        **os.environ,
        "DATABASE_URL": BENCH_DB,
        "RABBITMQ_URL": amqp_url,
        "CELERY_BROKER_URL": amqp_url,
        "RECOVERY_VHOSTS": vhost,
        "ALERTS_EVALUATE_SECONDS": str(EVALUATE_SECONDS),
        "ALERTS_DELIVER_SECONDS": "2",
        "SECRET_KEY": os.environ["SECRET_KEY"],
    }
    log = open(workdir / f"{name}.log", "w")  # noqa: SIM115 - closed below
    schedule = workdir / f"{name}.schedule"
    if separate:
        processes = [
            celery(
                [
                    "worker",
                    "--no-collector",
                    "-Q",
                    "lazarus.tasks,lazarus.replay",
                    "-c",
                    "2",
                    "-n",
                    f"tasks-{os.getpid()}@%h",
                    "-l",
                    "warning",
                ],
                env,
                log,
            ),
            celery(
                [
                    "worker",
                    "--no-collector",
                    "-Q",
                    "lazarus.alerts",
                    "-c",
                    "2",
                    "-n",
                    f"alerts-{os.getpid()}@%h",
                    "-l",
                    "warning",
                ],
                env,
                log,
            ),
        ]
    else:
        processes = [
            celery(
                [
                    "worker",
                    "--no-collector",
                    "-Q",
                    "lazarus.tasks,lazarus.replay,lazarus.alerts",
                    "-c",
                    "2",
                    "-n",
                    f"shared-{os.getpid()}@%h",
                    "-l",
                    "warning",
                ],
                env,
                log,
            )
        ]
    processes.append(celery(["beat", "-s", str(schedule), "-l", "warning"], env, log))
    try:
        deadline = time.monotonic() + 90
        while AlertRule.objects.get(pk=rule.pk).last_evaluated_at is None:
            if time.monotonic() > deadline:
                raise SystemExit(f"{name}: the rule was never evaluated (see {log.name})")
            time.sleep(0.25)
        seen, started = [], time.monotonic()
        while time.monotonic() - started < args.seconds:
            at = AlertRule.objects.filter(pk=rule.pk).values_list("last_evaluated_at", flat=True)[0]
            if not seen or at != seen[-1]:
                seen.append(at)
            time.sleep(0.25)
        # The gap still open at the end counts too (a stalled evaluator never updates it).
        ends = timezone.now()
        gaps = [(b - a).total_seconds() for a, b in zip(seen, seen[1:], strict=False)]
        gaps.append((ends - seen[-1]).total_seconds())
    finally:
        stop(processes)
        log.close()
        for receiver in receivers:
            receiver.close()
    outbox = {
        status: Notification.objects.filter(status=status).count()
        for status in ("pending", "sent", "failed")
    }
    attempts = sum(r.attempts for r in receivers)
    return {
        "evaluations": len(seen),
        "max_gap": max(gaps),
        "median_gap": statistics.median(gaps),
        "attempts": attempts,
        "outbox": outbox,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--receivers", type=int, default=10)
    parser.add_argument("--stall", type=float, default=60)
    parser.add_argument("--skip-shared", action="store_true", help="no contrast run")
    args = parser.parse_args()
    ensure_database()
    Message.objects.all().delete()
    from tests.helpers import make_message  # the one open message the rule counts

    make_message()
    workdir = Path(os.environ.get("TMPDIR", "/tmp")) / f"lazarus-bench-alerts-{os.getpid()}"
    workdir.mkdir(parents=True, exist_ok=True)
    layouts = [("separate", True)] + ([] if args.skip_shared else [("shared", False)])
    with private_vhost("lazarus-bench-alerts") as amqp_url:
        for name, separate in layouts:
            result = run_layout(name, separate, amqp_url, args, workdir)
            print(
                f"{name:>8}: {result['evaluations']} evaluations in {args.seconds:g} s, gap "
                f"median {result['median_gap']:.1f} s, max {result['max_gap']:.1f} s; "
                f"max gap / interval = {result['max_gap'] / EVALUATE_SECONDS:.2f} "
                f"(interval {EVALUATE_SECONDS} s); receivers saw {result['attempts']} attempts; "
                f"outbox {result['outbox']}",
                flush=True,
            )
    print(f"logs in {workdir}")


if __name__ == "__main__":
    main()
