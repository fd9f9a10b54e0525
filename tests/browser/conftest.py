"""Real headless Chromium (Debian's /usr/bin/chromium) driving the console on live_server.

Sync Playwright runs an asyncio event loop in this thread, and Django refuses ORM calls from a
thread with a running loop unless DJANGO_ALLOW_ASYNC_UNSAFE is set; the tests only touch the
database between browser steps, never concurrently with them.
"""

import os
import re
from pathlib import Path

import pytest

from tests.helpers import point_celery_at

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="session")
def chromium():
    from playwright.sync_api import sync_playwright

    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: `make setup` installs the Debian chromium package")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS
        )
        yield browser
        browser.close()
    os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)


class Tab:
    """One browser page plus what it saw: dialogs, console errors, CSP violations."""

    def __init__(self, page, base_url, name):
        self.page = page
        self.base_url = base_url
        self.name = name
        self.dialogs = []
        self.errors = []
        self.shots = 0
        page.on("dialog", self._dialog)
        page.on("console", self._console)
        page.on("pageerror", lambda exc: self.errors.append(f"pageerror: {exc}"))

    def _dialog(self, dialog):
        self.dialogs.append((dialog.type, dialog.message))
        dialog.dismiss()

    def _console(self, message):
        if message.type == "error":
            self.errors.append(f"{message.text} @ {message.location['url']}")

    def url(self, path):
        return self.base_url + path

    def goto(self, path):
        return self.page.goto(self.url(path))

    def login(self, username, password=None):
        self.goto("/login/")
        self.page.fill('input[name="username"]', username)
        self.page.fill('input[name="password"]', password or f"pw-{username}")
        self.page.click('button[type="submit"]')
        self.page.wait_for_url(re.compile(r"^(?!.*/login/).*$"))

    def screenshot(self, label):
        ARTIFACTS.mkdir(exist_ok=True)
        self.shots += 1
        path = ARTIFACTS / f"{self.name}-{self.shots:02d}-{label}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path


def _tab(chromium, live_server, request, **context_options):
    context = chromium.new_context(viewport={"width": 1400, "height": 900}, **context_options)
    page = context.new_page()
    page.set_default_timeout(15_000)
    # Any CSP violation becomes a console error naming the element, so `tab.errors == []` fails.
    page.add_init_script(
        "document.addEventListener('securitypolicyviolation', e => console.error("
        "'CSP violation', e.violatedDirective, e.target && e.target.outerHTML"
        " && e.target.outerHTML.slice(0, 200)))"
    )
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name)
    return context, Tab(page, live_server.url, name)


@pytest.fixture
def tab(chromium, live_server, request):
    context, tab = _tab(chromium, live_server, request)
    yield tab
    tab.screenshot("end")
    context.close()


@pytest.fixture
def new_tab(chromium, live_server, request):
    """``new_tab(**context_options)`` -> (its browser context, a Tab): a second browser of the
    test's own (the caller closes the context)."""
    return lambda **context_options: _tab(chromium, live_server, request, **context_options)


@pytest.fixture
def tab_without_js(chromium, live_server, request):
    context, tab = _tab(chromium, live_server, request, java_script_enabled=False)
    yield tab
    tab.screenshot("end")
    context.close()


@pytest.fixture
def job_worker(test_vhost):
    """Runs replay jobs like a Celery worker would, in a thread: ``job_worker.start(job)``.

    Job tasks are sent to this session's vhost (never to a queue a real worker reads); the
    test starts the task function itself, so it decides when the job begins to move.
    """
    import threading

    from django.conf import settings
    from django.db import connection

    from console.celery import app
    from recovery.replay.tasks import run_replay_job

    original = app.conf.broker_url
    point_celery_at(settings.RABBITMQ_URL)
    threads = []

    class Worker:
        def start(self, job):
            job.refresh_from_db()

            def work():
                try:
                    run_replay_job(job.pk, str(job.token))
                finally:
                    connection.close()

            thread = threading.Thread(target=work, daemon=True)
            thread.start()
            threads.append(thread)

    yield Worker()
    for thread in threads:
        thread.join(30)
    point_celery_at(original)
