"""/api/docs/ in real headless Chromium: every operation renders and nothing is fetched from
anywhere but this server (the Swagger UI assets come from drf-spectacular-sidecar)."""

import os
import urllib.parse

import pytest

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # sync Playwright runs an event loop

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.mark.browser
def test_the_docs_render_every_operation_from_this_server_only(live_server, client):
    import yaml
    from playwright.sync_api import sync_playwright

    schema = yaml.safe_load(client.get("/api/schema/").content)
    operations = sum(len(ops) for ops in schema["paths"].values())
    requested = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path="/usr/bin/chromium", headless=True, args=CHROMIUM_ARGS
        )
        page = browser.new_page()
        page.on("request", lambda request: requested.append(request.url))
        violations = []
        page.on(
            "console",
            lambda message: (
                "Content Security Policy" in message.text and violations.append(message.text)
            ),
        )
        response = page.goto(f"{live_server.url}/api/docs/")
        assert "script-src 'self'" in response.headers["content-security-policy"]
        page.wait_for_selector(".opblock", timeout=30_000)
        page.wait_for_load_state("networkidle")
        rendered = page.locator(".opblock").count()
        browser.close()
    assert rendered == operations
    assert violations == []  # the page works under its CSP
    own = urllib.parse.urlparse(live_server.url).netloc
    assert {urllib.parse.urlparse(url).netloc for url in requested} == {own}
    assert any("swagger-ui-bundle" in url for url in requested)
