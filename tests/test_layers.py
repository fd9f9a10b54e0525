"""The house rules, checked: every floor only points down, and no import circle, function-level
imports included.

The floors, lowest first (``FLOORS``): the client library other teams embed; pure leaves with no
models (errors, the dead-letter header vocabulary, globs, the database helpers); the engines that
read bodies and mask them, and the OpenTelemetry span intake (``recovery.telemetry``: decoding,
rows, their Parquet store), which know nothing of the models (``recovery.masking``'s policy and
trial read the rules, so they are domains) and talk to the broker (``recovery.broker``; its
``tasks`` write the tally's samples, so they are a domain); the models (``recovery.access``'s
models, teams, scope and SSO mappings too; its request helpers, SSO provisioning and login throttle
are domains); the domains that act on the store and the broker; the API, management commands and
Django's wiring; the console.
A module may import its own floor and the floors below. ``spark`` is a floor of its own: it runs
under spark-submit with no Django, and imports nothing of the rest.

Importing ``a.b.c`` runs ``a/__init__.py`` and ``a/b/__init__.py`` first, so an import counts
against every package on its way (the package rule): a leaf that imports ``recovery.bodies.decode``
also imports whatever ``recovery/bodies/__init__.py`` imports.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("console", "recovery", "spark")

# Lowest first; a module belongs to the floor of the longest prefix that names it.
FLOORS = (
    ("recovery.client",),
    (
        "recovery.errors",
        "recovery.old_task_names",
        "recovery.dead_letters",
        "recovery.globs",
        "recovery.rates",
        "recovery.db",
        "recovery",  # the package's own __init__ (empty)
    ),
    ("recovery.bodies", "recovery.masking", "recovery.broker", "recovery.telemetry"),
    ("recovery.models", "recovery.access"),
    (
        "recovery.collector",
        "recovery.broker.tasks",  # writes the tally's samples
        "recovery.replay",
        "recovery.retention",
        "recovery.search",
        "recovery.alerts",
        "recovery.audit",
        "recovery.export",
        "recovery.masking.policy",
        "recovery.masking.trial",
        "recovery.access.provisioning",
        "recovery.access.throttle",
        "recovery.access.tokens",
        "recovery.simulator",
    ),
    ("recovery.api", "recovery.management", "recovery.admin", "recovery.apps"),
    ("console",),
)


def module_name(path):
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules():
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if "migrations" not in path.parts:
                found[module_name(path)] = path
    return found


def with_packages(target, known):
    """``a.b.c`` and the packages importing it runs: ``a``, ``a.b`` (those of ours)."""
    parts = target.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts) + 1)} & known.keys()


def imports_of(name, path, known):
    """Our modules that ``name`` imports anywhere in its body (``from a import b`` counts a.b
    when that is a module of ours, else a), with the packages each import runs."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                targets.add(full if full in known else base)
    found = set()
    for target in targets:
        if target in known:
            found |= with_packages(target, known)
    # A module's own packages run before it anyway: not an edge.
    return found - with_packages(name, known)


def graph():
    known = modules()
    return {name: imports_of(name, path, known) for name, path in known.items()}


def floor(name):
    """The floor index of ``name``, or None for spark."""
    best, best_len = None, -1
    for index, prefixes in enumerate(FLOORS):
        for prefix in prefixes:
            if (name == prefix or name.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = index, len(prefix)
    return best


def wrong_edges(edges):
    wrong = []
    for name, targets in edges.items():
        for target in sorted(targets):
            crosses_spark = name.startswith("spark") != target.startswith("spark")
            up = not name.startswith("spark") and floor(target) > floor(name)
            if crosses_spark or up:
                wrong.append(f"{name} -> {target}")
    return sorted(wrong)


def test_every_module_has_a_floor():
    assert [
        name for name in modules() if not name.startswith("spark") and floor(name) is None
    ] == []


def test_layers_only_point_down():
    assert wrong_edges(graph()) == []


def strongly_connected(edges):
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in edges[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in edges:
        if node not in index:
            visit(node)
    return found


def test_no_import_circle_even_through_function_level_imports():
    assert strongly_connected(graph()) == []


def test_the_checker_finds_a_circle():
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c"]]


def test_the_package_rule_counts_the_packages_an_import_runs():
    known = {"a": None, "a.b": None, "a.b.c": None, "d": None}
    assert with_packages("a.b.c", known) == {"a", "a.b", "a.b.c"}


def test_the_checker_finds_an_import_up_a_floor():
    assert wrong_edges({"recovery.models.x": {"recovery.collector.rows"}}) == [
        "recovery.models.x -> recovery.collector.rows"
    ]
