"""The house rules, checked: layers only point down, and no import circle, function-level imports
included.

``console`` may import ``recovery``; ``recovery`` may import ``recovery.client``;
``recovery.client`` imports nothing of ``recovery``; ``spark`` imports neither (it runs under
spark-submit with no Django). A circle is found even when one side imports inside a function.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("console", "recovery", "spark")


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


def imports_of(name, path, known):
    """Our modules that ``name`` imports anywhere in its body (``from a import b`` counts a.b
    when that is a module of ours, else a)."""
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
    return {target for target in targets if target in known and target != name}


def graph():
    known = modules()
    return {name: imports_of(name, path, known) for name, path in known.items()}


def layer(name):
    if name.startswith("recovery.client"):
        return 0
    if name.startswith("recovery"):
        return 1
    if name.startswith("console"):
        return 2
    return None  # spark: a layer of its own


def test_layers_only_point_down():
    wrong = []
    for name, targets in graph().items():
        for target in targets:
            crosses_spark = name.startswith("spark") != target.startswith("spark")
            if crosses_spark or (layer(name) is not None and layer(target) > layer(name)):
                wrong.append(f"{name} -> {target}")
    assert wrong == []


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
