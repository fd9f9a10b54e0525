from django import template
from django.utils.html import format_html

register = template.Library()


@register.filter
def item(mapping, key):
    """``{{ entry|item:"routing-keys" }}``: dict lookup for keys that are not identifiers."""
    try:
        return mapping.get(key, "")
    except AttributeError:
        return ""


@register.filter
def getfield(form, name):
    """``{{ form|getfield:name }}``: a bound field by a name held in a variable."""
    return form[name]


@register.filter
def as_text(value):
    """Stored bytes (a memoryview from PostgreSQL) as text for display; undecodable bytes as �."""
    if value is None:
        return ""
    return bytes(value).decode("utf-8", "replace")


@register.filter
def pretty_json(value):
    import json

    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)


@register.filter
def duration(seconds):
    """Seconds as a person reads them: "45 s", "35 min", "2 h 5 min", "3 d 4 h"."""
    if seconds is None or seconds == "":
        return "–"
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds} s"
    minutes, _ = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


@register.filter
def sparkline(values, size="120x24"):
    """An inline SVG line of ``values`` (no script, no style attribute: the CSP allows it)."""
    width, height = (int(x) for x in size.split("x"))
    values = list(values or [])
    if len(values) < 2:
        return ""
    top = max(max(values), 1)
    step = width / (len(values) - 1)
    points = " ".join(
        f"{i * step:.1f},{height - 2 - (v / top) * (height - 4):.1f}" for i, v in enumerate(values)
    )
    label = ", ".join(str(v) for v in values)
    return format_html(
        '<svg class="spark" width="{}" height="{}" viewBox="0 0 {} {}" role="img" '
        'aria-label="per hour: {}"><polyline fill="none" stroke="currentColor" stroke-width="1.5" '
        'points="{}"/></svg>',
        width,
        height,
        width,
        height,
        label,
        points,
    )
