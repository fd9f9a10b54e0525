"""The client library as other teams install it (#18): the wheel `make client-wheel` builds, in a
fresh virtualenv with no Django and no psycopg, publishing and consuming against the real broker."""

import json
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

ROUND_TRIP = textwrap.dedent(
    """
    import importlib.util, json, sys, threading
    from recovery.client import IdempotentConsumer, ReliablePublisher

    url, queue, log_dir = sys.argv[1:4]
    assert importlib.util.find_spec("django") is None, "django is installed"
    assert importlib.util.find_spec("psycopg") is None, "psycopg is installed"
    import pika
    connection = pika.BlockingConnection(pika.URLParameters(url))
    connection.channel().queue_declare(queue, durable=True)
    connection.close()

    publisher = ReliablePublisher(
        url, producer="wheel", log_dir=log_dir, returns_queue=queue + ".r"
    )
    sent = [publisher.publish("", queue, f"m{i}".encode()) for i in range(20)]
    assert publisher.flush(timeout=20)
    publisher.close()

    got, done = [], threading.Event()
    def handler(delivery):
        got.append(delivery.message_id)
        if len(got) == len(sent):
            done.set()
    consumer = IdempotentConsumer(url, queue, group="wheel", handler=handler, log_dir=log_dir)
    thread = threading.Thread(target=consumer.run)
    thread.start()
    done.wait(30)
    consumer.stop()
    thread.join(10)
    try:
        IdempotentConsumer(url, queue, group="g", handler=handler, dedup="postgresql://x/y")
    except ImportError as exc:
        missing = str(exc)
    print(json.dumps({"sent": sent, "got": got, "missing": missing}))
    """
)


@pytest.mark.slow
def test_the_wheel_installs_without_lazarus_and_round_trips(tmp_path, amqp_url, names):
    built = subprocess.run(
        [str(ROOT / "scripts" / "build-client.sh")], capture_output=True, text=True, cwd=ROOT
    )
    assert built.returncode == 0, built.stderr
    wheel = Path(ROOT / built.stdout.split()[-1])
    with zipfile.ZipFile(wheel) as archive:
        files = archive.namelist()
    assert "recovery/client/LOGS.md" in files and "recovery/client/py.typed" in files
    assert "recovery/__init__.py" not in files  # `recovery` is only a namespace there

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    installed = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", str(wheel)], capture_output=True, text=True
    )
    assert installed.returncode == 0, installed.stderr
    run = subprocess.run(
        [str(venv / "bin" / "python"), "-c", ROUND_TRIP, amqp_url, names["queue"], str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,  # not the repository: only the installed package can be imported
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout.splitlines()[-1])
    assert sorted(result["got"]) == sorted(result["sent"]) and len(result["sent"]) == 20
    assert "pip install 'lazarus-client[postgres]'" in result["missing"]
