"""A rule in one state on the Alerts pages: a rule whose check raised is "unknown" on the list
and on its own page, never an "ok" (or "firing") badge beside or above "cannot check"."""

import re

import pytest
from django.utils import timezone

from recovery.alerts.engine import evaluate
from recovery.models import AlertRule

pytestmark = pytest.mark.django_db

BADGE = re.compile(r'<span class="badge (\w+)"[^>]*>([^<]*)</span>')


def row(page, rule):
    found = re.search(rf'<tr id="rule-{rule.pk}">(.*?)</tr>', page, re.S)
    assert found, page
    return found.group(1)


def badges(html):
    return [(kind, text.strip()) for kind, text in BADGE.findall(html)]


def test_a_rule_whose_check_raises_is_unknown_on_the_list_and_its_page(logged_in, viewer):
    # Saved before params were checked: its check raised AttributeError on every evaluation.
    broken = AlertRule.objects.create(
        name="audit typed as a number", kind="audit", params={"missing_after": 6}
    )
    evaluate(now=timezone.now())
    client = logged_in(viewer)

    listing = client.get("/alerts/").content.decode()
    cells = row(listing, broken)
    assert badges(cells) == [("warn", "unknown")]
    assert "cannot check: InvalidParams" in cells and "missing_after" in cells
    assert 'id="unknown-count">1 unknown<' in listing

    page = client.get(f"/alerts/{broken.pk}/").content.decode()
    title = re.search(r"<h1>(.*?)</h1>", page, re.S).group(1)
    assert badges(title) == [("warn", "unknown")] and 'id="rule-state"' in title
    assert "Cannot check: InvalidParams" in page
    assert "AttributeError" not in page


def test_a_firing_rule_that_cannot_check_says_it_was_firing_not_that_it_fires(logged_in, viewer):
    blind = AlertRule.objects.create(
        name="blind",
        kind="broker_alarm",
        state="unknown",
        last_known_state="firing",
        last_error="ManagementError: management API unreachable",
        last_summary="1 alarm",
        last_evaluated_at=timezone.now(),
    )
    client = logged_in(viewer)
    listing = client.get("/alerts/").content.decode()
    cells = row(listing, blind)
    assert badges(cells) == [("warn", "unknown")]
    assert "was firing before" in cells
    assert 'id="firing-count"' not in listing

    page = client.get(f"/alerts/{blind.pk}/").content.decode()
    assert "Last known (firing): 1 alarm" in page
    title = re.search(r"<h1>(.*?)</h1>", page, re.S).group(1)
    assert badges(title) == [("warn", "unknown")]


def test_a_rule_beat_has_not_evaluated_is_unknown_with_the_reason(logged_in, viewer):
    stale = AlertRule.objects.create(name="stale", kind="audit", state="firing")
    listing = logged_in(viewer).get("/alerts/").content.decode()
    assert badges(row(listing, stale)) == [("warn", "unknown: never evaluated")]
