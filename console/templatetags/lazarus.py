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
