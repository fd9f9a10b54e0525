"""Every environment variable Lazarus reads is documented in docs/settings.md (#18)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Read by the code but not settings anyone sets: the collector process's parent pid (set by the
# worker that spawns it) and Django's own.
INTERNAL = {"LAZARUS_COLLECTOR_PARENT", "DJANGO_SETTINGS_MODULE"}


def variables_read():
    names = set()
    settings_source = (ROOT / "console" / "settings.py").read_text()
    names |= set(re.findall(r'env_\w+\(\s*"([A-Z][A-Z0-9_]+)"', settings_source))
    for package in ("console", "recovery", "spark"):
        for path in (ROOT / package).rglob("*.py"):
            names |= set(
                re.findall(r'os\.environ(?:\.get)?[\[(]\s*"([A-Z][A-Z0-9_]+)"', path.read_text())
            )
    return names - INTERNAL


def test_every_variable_the_code_reads_has_a_row():
    documented = (ROOT / "docs" / "settings.md").read_text()
    names = variables_read()
    assert len(names) > 50  # the scan itself works
    missing = sorted(name for name in names if f"`{name}`" not in documented)
    assert missing == [], f"add these to docs/settings.md: {missing}"
