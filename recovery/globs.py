"""Scope globs matched in Python in linear time (docs/security.md, "Teams").

A team's scope is a glob (``*`` any run of characters, none included; ``?`` one character;
everything else literal). Translated to a Python ``re`` (``^a.*b.*c$``), a glob with many
``*`` backtracks: 8 wildcards made one message's page take 2.6 s, 10 take minutes, and every
masked message, access check and alert rule asks. So Python never runs a glob as a regular
expression: the glob is split on ``*`` and each literal piece is found left to right, the
leftmost occurrence each time, which is O(len(name) x len(glob)) and never backtracks.
(Taking the leftmost occurrence is always right: anything a later occurrence could match
after it, the earlier one can match too.) PostgreSQL runs the same globs as anchored regular
expressions (``recovery.access.teams.glob_to_regex``); its engine is a DFA, linear as well.
"""

import functools


@functools.lru_cache(maxsize=4096)
def _pieces(pattern):
    return tuple(pattern.split("*"))


def _piece_at(piece, name, at):
    """Whether ``piece`` (literal but for ``?``, any one character) matches ``name`` at
    ``at`` (the caller checked that it fits)."""
    if "?" not in piece:
        return name.startswith(piece, at)
    return all(p == "?" or p == c for p, c in zip(piece, name[at : at + len(piece)], strict=True))


def _find(piece, name, start, end):
    """The leftmost position >= ``start`` where ``piece`` matches inside ``name[:end]``; -1."""
    if "?" not in piece:
        return name.find(piece, start, end)
    for at in range(start, end - len(piece) + 1):
        if _piece_at(piece, name, at):
            return at
    return -1


def glob_match(pattern, name):
    """Whether ``name`` matches the glob ``pattern`` as a whole (as ``fnmatch.fnmatchcase``
    would with ``[`` taken literally, and as PostgreSQL's ``name ~ glob_to_regex(pattern)``)."""
    name = name or ""
    pieces = _pieces(pattern)
    if len(pieces) == 1:
        return len(name) == len(pattern) and _piece_at(pattern, name, 0)
    first, *middle, last = pieces
    tail = len(name) - len(last)
    if tail < len(first) or sum(map(len, pieces)) > len(name):
        return False
    if not (_piece_at(first, name, 0) and _piece_at(last, name, tail)):
        return False
    at = len(first)
    for piece in middle:
        found = _find(piece, name, at, tail)
        if found < 0:
            return False
        at = found + len(piece)
    return True
