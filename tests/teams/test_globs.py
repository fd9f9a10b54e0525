"""Scope globs in Python (recovery.globs): exactly fnmatch's answer (with ``[`` literal) and
PostgreSQL's, and linear time on globs a regular expression backtracks on (#46 item 12)."""

import fnmatch
import random
import time

import pytest
from django.db import connection

from recovery.globs import glob_match
from recovery.models import Scope, Team, TeamScope, glob_to_regex

CASES = [
    ("pay.*", "pay.cards", True),
    ("pay.*", "pay.", True),
    ("pay.*", "payxcards", False),
    ("pay.*", "pay", False),
    ("*", "", True),
    ("*", "anything", True),
    ("", "", True),
    ("", "a", False),
    ("?", "", False),
    ("?", "a", True),
    ("?", "ab", False),
    ("a*a", "a", False),
    ("a*a", "aa", True),
    ("a*a", "aba", True),
    ("a*b*c", "abc", True),
    ("a*b*c", "acb", False),
    ("a*b*c", "axxbyyc", True),
    ("a*b*c", "axxbyycd", False),
    ("*.dlq", "orders.dlq", True),
    ("*.dlq", "orders.dlq.x", False),
    ("a?c[1]", "abc[1]", True),
    ("a?c[1]", "abc1", False),
    ("[ab]", "a", False),
    ("[ab]", "[ab]", True),
    ("**", "x", True),
    ("a**b", "ab", True),
    ("*ab*ab*", "abab", True),
    ("*ab*ab*", "aba", False),
    ("*a?a*", "xaya", True),
    ("*a?a*", "xaay", False),
    ("q.*.v?", "q.x.v1", True),
    ("q.*.v?", "q..v", False),
    ("line\n*", "line\nx", True),
    ("x*", "x\n", True),
    ("x", "x\n", False),
    ("ünï*", "ünïcode", True),
]


def fnmatch_literal_brackets(name, pattern):
    return fnmatch.fnmatchcase(name, pattern.replace("[", "[[]"))


@pytest.mark.parametrize(("pattern", "name", "expected"), CASES)
def test_it_matches_a_table_of_cases_as_fnmatch_does(pattern, name, expected):
    assert glob_match(pattern, name) is expected
    assert fnmatch_literal_brackets(name, pattern) is expected


def test_it_matches_random_globs_as_fnmatch_does():
    rng = random.Random(46)
    for _ in range(20_000):
        pattern = "".join(rng.choice("ab*?.") for _ in range(rng.randint(0, 7)))
        name = "".join(rng.choice("ab.") for _ in range(rng.randint(0, 9)))
        assert glob_match(pattern, name) is fnmatch_literal_brackets(name, pattern), (
            pattern,
            name,
        )


@pytest.mark.django_db
def test_it_matches_as_postgresql_does():
    with connection.cursor() as cur:
        for pattern, name, expected in CASES:
            cur.execute("SELECT %s ~ %s", [name, glob_to_regex(pattern)])
            assert cur.fetchone()[0] is expected, (pattern, name)


def test_it_answers_a_pathological_glob_in_linear_time():
    # Python re took minutes on this: 2**10-ish ways to place each ".*" before failing.
    pattern = "a*" * 20 + "b"
    name = "a" * 255
    started = time.perf_counter()
    for _ in range(100):
        assert glob_match(pattern, name) is False
        assert glob_match("*a?" * 20 + "*b", name) is False
    assert time.perf_counter() - started < 0.5


@pytest.mark.django_db
def test_it_checks_a_name_against_a_pathological_scope_fast():
    team = Team.objects.create(name="globs")
    TeamScope.objects.create(team=team, vhost="/", queue_pattern="a*" * 12 + "b")
    scope = TeamScope.objects.get(team=team)
    started = time.perf_counter()
    assert scope.matches("/", "a" * 250, "") is False
    assert Scope.covers(team.pk, "/", "a" * 250, "") is False
    assert scope.matches("/", "a" * 12 + "b", "") is True
    assert time.perf_counter() - started < 0.5
