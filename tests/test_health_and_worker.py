"""/healthz, and the collector running inside a real Celery worker process (the bootstep)."""

import json
import os
import subprocess
import sys
import urllib.parse

import pika
import pytest
from django.conf import settings

from recovery.models import CollectorHeartbeat, Message
from tests.helpers import WorkerProcess, make_user, wait_for


@pytest.mark.django_db(transaction=True)
def test_healthz_reports_database_broker_and_collector(client, collector, wired):
    wait_for(lambda: CollectorHeartbeat.objects.exists(), message="a collector heartbeat")
    client.force_login(make_user("health-admin", "admin"))  # the detail is for global admins
    report = client.get("/healthz").json()
    assert report["database"]["ok"] and report["broker"]["ok"]
    assert report["collector"]["running"]
    assert report["collector"]["lag"][wired]["recovery.dead_letters"] == 0


def test_healthz_says_503_when_the_broker_is_unreachable(client, db, settings):
    settings.RABBITMQ_URL = "amqp://guest:guest@127.0.0.1:1/%2F"
    response = client.get("/healthz")
    assert response.status_code == 503
    assert response.json()["broker"]["ok"] is False


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_celery_worker_runs_the_collector(wired, clean_queues, tmp_path):
    worker = WorkerProcess.collector(tmp_path / "worker.log", stop_timeout=20).start()
    try:
        channel = pika.BlockingConnection(pika.URLParameters(settings.RABBITMQ_URL)).channel()
        channel.queue_declare(
            "app.worker", arguments={"x-dead-letter-exchange": "recovery.dlx", "x-message-ttl": 0}
        )
        channel.basic_publish(
            "", "app.worker", b"via celery", pika.BasicProperties(message_id="celery-1")
        )
        wait_for(
            lambda: Message.objects.filter(message_id="celery-1").exists(),
            timeout=60,
            message="the worker's collector to store the message",
        )
    finally:
        worker.stop()
    # A clean exit: SIGTERM's warm shutdown stopped the collector and the worker returned 0 by
    # itself (a worker that hung would have been killed after 20 s: -9).
    assert worker.returncode == 0, worker.log()
    assert urllib.parse.urlparse(worker.env["DATABASE_URL"]).path.startswith("/test_")


def in_a_fresh_worker(expression):
    """The JSON value of ``expression`` in a new interpreter that has imported what a worker
    imports at start (not what this test session happens to have imported)."""
    script = (
        "import django, json, sys; django.setup(); from console.celery import app; "
        f"app.loader.import_default_modules(); print(json.dumps({expression}))"
    )
    return json.loads(
        subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True)
        .stdout.strip()
        .splitlines()[-1]
    )


def test_every_beat_entry_names_a_task_a_fresh_worker_registers():
    from console.celery import app

    registered = in_a_fresh_worker("sorted(app.tasks)")
    scheduled = {entry["task"] for entry in app.conf.beat_schedule.values()}
    assert scheduled and not scheduled - set(registered), scheduled - set(registered)
    assert "recovery.replay.tasks.run_replay_job" in registered
    assert "recovery.tasks.run_replay_job" in registered  # the old name, for one release


def test_a_fresh_worker_does_not_load_the_audits_arrow_and_numpy():
    """~80 MB every worker (the collector's too) would carry for a task that runs nightly."""
    loaded = in_a_fresh_worker("sorted({m.split('.')[0] for m in sys.modules})")
    assert "recovery" in loaded and "celery" in loaded
    assert not {"pyarrow", "numpy", "pyspark"} & set(loaded)


# ---- what anonymous callers and orchestrators see (#18, #20) -------------------------------


@pytest.mark.django_db(transaction=True)
def test_anonymous_healthz_says_up_or_down_and_nothing_else(client, collector, wired):
    wait_for(lambda: CollectorHeartbeat.objects.exists(), message="a collector heartbeat")
    response = client.get("/healthz")
    assert response.status_code == 200
    assert set(response.json()) == {"ok", "database", "broker", "detail"}
    body = response.content.decode()
    assert "recovery.dead_letters" not in body and str(os.getpid()) not in body


@pytest.mark.django_db(transaction=True)
def test_an_admins_api_token_sees_the_details(client, collector, wired):
    from recovery.models import ApiToken

    _token, raw = ApiToken.issue(make_user("health-bot", "admin"))
    report = client.get("/healthz", HTTP_AUTHORIZATION=f"Token {raw}").json()
    assert "collector" in report


def test_livez_answers_without_the_database_or_the_broker(client, settings):
    settings.RABBITMQ_URL = "amqp://guest:guest@127.0.0.1:1/%2F"
    response = client.get("/livez")
    assert response.status_code == 200 and response.json() == {"ok": True}


@pytest.mark.django_db
def test_readyz_checks_database_migrations_and_broker(client, settings, wired):
    ready = client.get("/readyz")
    assert ready.status_code == 200, ready.content
    assert ready.json()["migrations"] == {"ok": True}
    settings.RABBITMQ_URL = "amqp://guest:guest@127.0.0.1:1/%2F"
    down = client.get("/readyz")
    assert down.status_code == 503
    assert down.json()["broker"]["ok"] is False and down.json()["database"]["ok"] is True


@pytest.mark.django_db
def test_it_tells_anonymous_readyz_callers_only_up_or_down(client, settings, wired):
    settings.RABBITMQ_URL = "amqp://guest:guest@127.0.0.1:1/%2F"
    anonymous = client.get("/readyz").json()
    assert anonymous == {
        "ok": False,
        "database": {"ok": True},
        "migrations": {"ok": True},
        "broker": {"ok": False},
    }
    client.force_login(make_user("ready-admin", "admin"))  # a viewer gets up/down (#46)
    detailed = client.get("/readyz").json()
    assert detailed["migrations"] == {"ok": True, "unapplied": 0}
    assert "error" in detailed["broker"]
