"""Team helpers: teams with their scopes, members, and team A's ids every console URL is filled
with (tests/teams/test_team_matrix.py)."""

import re

from django.urls import URLPattern, URLResolver, get_resolver

from recovery.models import Membership, Team, TeamScope
from tests.helpers import make_user


def team(name, *patterns, vhost="/"):
    made = Team.objects.create(name=name)
    for pattern in patterns:
        TeamScope.objects.create(team=made, vhost=vhost, queue_pattern=pattern)
    return made


def member(username, of, role="operator", global_role=None):
    user = make_user(username, global_role)
    Membership.objects.create(user=user, team=of, role=role)
    return user


# Every object of team A gets an id from here on (each table's sequence is moved), so a
# parameter filled with A_IDS names one of A's messages, jobs, rules, channels or users.
A_BASE = 7_300_000


A_IDS = [A_BASE + 1, A_BASE + 2, A_BASE + 3]


# A day's audit run is every team's (each sees its own windows of it): not one of A's ids.
SHARED_RUN = 7_200_001


A_GROUP = "0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a"


# How to fill a URL parameter, by name (console routes and API paths alike).
PARAMETERS = {
    "pk": [*A_IDS, SHARED_RUN],
    "id": [*A_IDS, SHARED_RUN],
    "path": ["v0/messages"],
    "what": ["team", "scope", "member"],
    "key": [A_GROUP],  # a failure group's page
    # Django admin's own routes (staff only; team members are not staff).
    "app_label": ["recovery"],
    "object_id": [str(A_BASE + 1)],
    "content_type_id": ["1"],
    "url": ["recovery/"],
}


def fill_url(template, placeholder):
    """Every way to fill ``template``'s parameters (``placeholder`` finds them)."""
    names = re.findall(placeholder, template)
    urls = [template]
    for name in names:
        assert name in PARAMETERS, f"no filling for URL parameter {name!r} in {template!r}"
        urls = [
            re.sub(placeholder.replace(r"(\w+)", re.escape(name)), str(value), url, count=1)
            for url in urls
            for value in PARAMETERS[name]
        ]
    return urls


def console_urls(patterns=None, prefix=""):
    """Every console URL pattern, recursively, as concrete paths."""
    found = []
    for entry in patterns if patterns is not None else get_resolver().url_patterns:
        if isinstance(entry, URLResolver):
            found += console_urls(entry.url_patterns, prefix + _pattern_text(entry))
        elif isinstance(entry, URLPattern):
            found += fill_url(prefix + _pattern_text(entry), r"<(?:\w+:)?(\w+)>")
    return found


def _pattern_text(entry):
    text = str(entry.pattern)
    if hasattr(entry.pattern, "regex") and not hasattr(entry.pattern, "_route"):
        text = text.lstrip("^").removesuffix("$").removesuffix(r"\Z")
        text = re.sub(r"\(\?P<(\w+)>(?:[^()]|\([^()]*\))*\)", r"<\1>", text)
        text = text.replace("\\", "")
    return text
