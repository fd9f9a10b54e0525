from recovery.models import ROLE_ORDER, Role, Team, role_of, scope_of


def roles(request):
    """The user's role once per request (one query), and what it allows the templates to show."""
    user = getattr(request, "user", None)
    role = role_of(user)
    rank = ROLE_ORDER.index(role) if role is not None else -1
    scope = scope_of(request) if user and user.is_authenticated else None
    teams = scope.team_ids() if scope is not None and not scope.is_global else []
    return {
        # The header names a team member's teams next to their role.
        "team_names": list(Team.objects.filter(pk__in=teams).values_list("name", flat=True))
        if teams
        else [],
        "role": role.value if role is not None else "",
        "can_operate": rank >= ROLE_ORDER.index(Role.OPERATOR),
        "is_admin": rank >= ROLE_ORDER.index(Role.ADMIN),
        # A team member's pages are narrowed to their teams; broker-wide pages refuse them.
        "is_global": bool(scope is not None and scope.is_global),
    }
