from django import template

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
