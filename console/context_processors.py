from recovery.models import ROLE_ORDER, Role, role_of, scope_of


def roles(request):
    """The user's role once per request (one query), and what it allows the templates to show."""
    user = getattr(request, "user", None)
    role = role_of(user)
    rank = ROLE_ORDER.index(role) if role is not None else -1
    return {
        "role": role.value if role is not None else "",
        "can_operate": rank >= ROLE_ORDER.index(Role.OPERATOR),
        "is_admin": rank >= ROLE_ORDER.index(Role.ADMIN),
        # A team member's pages are narrowed to their teams; broker-wide pages refuse them.
        "is_global": bool(user and user.is_authenticated and scope_of(request).is_global),
    }
