"""Running the simulate command in a test and reading back what it left behind."""

import io
import json
import os
import re

from django.core.management import call_command

from tests.helpers import drain  # noqa: F401 - the simulator tests' import

# Shares high enough that a run of ~150 messages meets every fault (the seed makes it certain).
BUSY_FAULTS = (
    "--reject",
    "0.08",
    "--ttl",
    "0.08",
    "--overflow",
    "0.08",
    "--unroutable",
    "0.06",
    "--returned",
    "0.04",
    "--nack",
    "0.04",
    "--poison",
    "0.04",
    "--crash",
    "0.04",
)


def simulate(tmp_path, *args, name="run"):
    """call_command('simulate') into ``tmp_path/name``; returns (truth, printed output, paths)."""
    base = tmp_path / name
    paths = {
        "logs": base / "logs",
        "truth": base / "truth.json",
        "bindings": base / "bindings.json",
    }
    out = io.StringIO()
    call_command(
        "simulate",
        "--log-dir",
        str(paths["logs"]),
        "--truth",
        str(paths["truth"]),
        "--settle-timeout",
        "90",
        *args,
        stdout=out,
    )
    return json.loads(paths["truth"].read_text()), out.getvalue(), paths


def read_log_lines(log_dir):
    """[(path relative to log_dir, parsed line)] of every JSON Lines file under ``log_dir``."""
    lines = []
    for root, _dirs, files in os.walk(log_dir):
        for filename in files:
            path = os.path.join(root, filename)
            with open(path, encoding="utf-8") as handle:
                for raw in handle:
                    lines.append((os.path.relpath(path, log_dir), json.loads(raw)))
    return lines


def of_run(messages, truth):
    prefix = re.escape(truth["run_id"]) + "-"
    return [(p, b) for p, b in messages if p.message_id and re.match(prefix, p.message_id)]
