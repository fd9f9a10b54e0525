"""The tests' own layout (#52): helpers live in tests/helpers/, fixtures in conftest.py files.

No module under tests/ imports a test module (``test_*.py``) or a conftest: pytest finds a
conftest's fixtures without an import, and a helper two test packages share belongs in
tests/helpers/. Importing a test module runs its module code again under another name (and
collects nothing); importing a conftest makes it a module of two names, each with its own state.
"""

import ast
from pathlib import Path

TESTS = Path(__file__).parent
SKIP = {"node_modules", "__pycache__"}


def python_files(root):
    for path in sorted(root.rglob("*.py")):
        if not SKIP & set(path.relative_to(root).parts):
            yield path


def _is_test_or_conftest(module):
    """Whether ``module`` (tests.a.b...) is, or is inside, a test module or a conftest."""
    return any(part == "conftest" or part.startswith("test_") for part in module.split(".")[1:])


def _package_of(path, root):
    """The dotted package ``path`` is in (``tests.replay`` for tests/replay/test_jobs.py)."""
    parts = path.relative_to(root.parent).with_suffix("").parts
    return parts[:-1]


def imported_modules(path, root):
    """(line, module) for each module ``path`` imports: ``import a.b``, ``from a.b import c``
    (a.b, and a.b.c, which may be a module too), relative imports resolved against the file's
    package."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = _package_of(path, root)
                base = package[: len(package) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            yield node.lineno, module
            for alias in node.names:
                yield node.lineno, f"{module}.{alias.name}"


def layout_problems(root=TESTS):
    """Every import of a test module or a conftest under ``root``, as "path:line imports module"."""
    problems = {}
    for path in python_files(root):
        for line, module in imported_modules(path, root):
            if module.split(".")[0] == root.name and _is_test_or_conftest(module):
                where = f"{path.relative_to(root.parent)}:{line}"
                problems[where] = min(problems.get(where, module), module, key=len)
    return [f"{where} imports {module}" for where, module in sorted(problems.items())]


def test_no_test_module_imports_another_test_module_or_a_conftest():
    assert layout_problems() == []


def test_the_check_sees_every_way_to_import_one(tmp_path):
    root = tmp_path / "tests"
    (root / "replay").mkdir(parents=True)
    (root / "replay" / "conftest.py").write_text("")
    (root / "replay" / "test_a.py").write_text("def helper(): ...\n")
    (root / "replay" / "test_b.py").write_text(
        "from tests.replay.conftest import store\n"
        "import tests.replay.conftest\n"
        "from tests.replay import test_a\n"
        "from .test_a import helper\n"
        "from . import conftest\n"
        "def f():\n"
        "    from tests.replay.test_a import helper\n"
        "from tests.helpers import drain\n"
        "from tests.helpers.replay import run\n"
    )
    assert layout_problems(root) == [
        "tests/replay/test_b.py:1 imports tests.replay.conftest",
        "tests/replay/test_b.py:2 imports tests.replay.conftest",
        "tests/replay/test_b.py:3 imports tests.replay.test_a",
        "tests/replay/test_b.py:4 imports tests.replay.test_a",
        "tests/replay/test_b.py:5 imports tests.replay.conftest",
        "tests/replay/test_b.py:7 imports tests.replay.test_a",
    ]
