"""An audit report draws its charts from the run's windows."""

import pytest
from playwright.sync_api import expect

from tests.helpers.audit import make_run

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_an_audit_report_renders_its_charts(tab, viewer):
    run = make_run()
    tab.login("vera")
    tab.goto("/audits/")
    tab.page.click(f'a[href="/audits/{run.pk}/"]')

    for chart in ("chart-lost", "chart-dups", "chart-latency"):
        expect(tab.page.locator(f'canvas#{chart}[data-rendered="1"]')).to_have_count(1)
    groups = tab.page.evaluate(
        "() => Chart.getChart(document.getElementById('chart-lost')).data.datasets"
        ".map(d => d.label)"
    )
    assert groups == ["billing", "shipping"]
    expect(tab.page.locator("#run-finality")).to_have_text("PROVISIONAL")
    tab.screenshot("report")
    tab.page.click('text="evidence" >> nth=0')
    expect(tab.page.locator("h1")).to_have_text("Evidence")
    assert tab.errors == [], tab.errors
