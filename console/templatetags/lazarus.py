from django import template

register = template.Library()


@register.filter
def item(mapping, key):
    """``{{ entry|item:"routing-keys" }}``: dict lookup for keys that are not identifiers."""
    try:
        return mapping.get(key, "")
    except AttributeError:
        return ""
