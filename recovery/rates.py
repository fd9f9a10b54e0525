"""Rates like ``600/min``: one parser for the settings (API_RATE_LIMIT) and the API throttle.

A leaf module (no Django): console/settings.py imports it while settings load.
"""

import re

PERIODS = {"s": 1, "sec": 1, "second": 1, "m": 60, "min": 60, "minute": 60, "h": 3600}
PERIODS.update({"hour": 3600, "d": 86400, "day": 86400})
RATE = re.compile(r"^\s*(\d+)\s*/\s*([a-z]+)\s*$")


def parse_rate(text):
    """'600/min' -> (600, 60). Raises ValueError naming the accepted forms."""
    match = RATE.match(text or "")
    if not match or match.group(2) not in PERIODS or int(match.group(1)) < 1:
        raise ValueError(f"{text!r} is not a rate like 600/min (periods: s, min, hour, day)")
    return int(match.group(1)), PERIODS[match.group(2)]
