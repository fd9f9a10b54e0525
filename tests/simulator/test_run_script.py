"""#46: `make run` (scripts/run.sh) keeps the console and the collector up when the demo
traffic exits. The script's own ``demo`` function is run here, in a real bash, with the
simulator replaced by a command that fails as it does when RabbitMQ is out of reach."""

import re
import signal
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = (ROOT / "scripts" / "run.sh").read_text()


def test_only_the_products_processes_end_the_run():
    assert "demo &\ndemo_pid=$!\n" in SCRIPT
    waited = SCRIPT.strip().splitlines()[-1]
    assert waited == 'wait -n "${pids[@]}"'
    # The demo's pid is never added to the processes waited on; the stop still ends it.
    assert not re.search(r"demo.*\n\s*pids\+=", SCRIPT)
    assert 'kill "${pids[@]}" $demo_pid' in SCRIPT


def test_the_demo_traffic_is_restarted_after_it_exits_and_stops_on_term(tmp_path):
    function = re.search(r"^demo\(\) \{\n.*?^\}\n", SCRIPT, re.S | re.M)[0]
    runs = tmp_path / "runs"
    manage = tmp_path / "manage"  # stands for "python manage.py": it fails at once
    manage.write_text(f'#!/bin/sh\necho "$1" >> {runs}\nexit 3\n')
    manage.chmod(0o755)
    harness = f"set -euo pipefail\nM={manage}\nDEMO_RESTART_SECONDS=0.2\n{function}demo\n"
    process = subprocess.Popen(
        ["bash", "-c", harness], stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (
            not runs.exists() or len(runs.read_text().split()) < 3
        ):
            time.sleep(0.05)
        assert process.poll() is None  # still supervising
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=10)
    assert set(runs.read_text().split()) == {"simulate"} and len(runs.read_text().split()) >= 3
    assert process.returncode == 0
    assert (
        "run.sh: the demo traffic (manage.py simulate) exited (3); the console and the "
        "collector keep running; restarting it in 0.2 s"
    ) in stderr
