from rest_framework import permissions

from recovery.models import Role, scope_of


class RolePermission(permissions.BasePermission):
    """Viewers read; operators also replay/discard/start jobs; admins also manage users/tokens.

    A view may set ``required_role`` to demand more than the method implies. The role is the
    caller's: a token acting as a team has its user's role in that team. A team caller (a user
    in a team, or a team token) is refused by every view not marked ``team_scoped`` (see
    ``recovery.access.scope``): an endpoint added without scoping fails closed.
    """

    message = "Your role does not allow this."

    def has_permission(self, request, view):
        if not request.user or not request.user.is_authenticated:
            return False
        required = getattr(self, "required", None) or getattr(view, "required_role", None)
        if required is None:
            required = Role.VIEWER if request.method in permissions.SAFE_METHODS else Role.OPERATOR
        scope = scope_of(request)
        if not scope.is_global and not getattr(view, "team_scoped", False):
            self.message = "Not available to team members."
            return False
        return scope.has_role(required)


def requires(role):
    """A permission class demanding ``role`` whatever the method (e.g. a POST that only reads)."""
    return type(f"Requires{Role(role).label}", (RolePermission,), {"required": Role(role)})


# Admin resources (tokens, teams, rules...): admins only, reads included.
AdminOnly = requires(Role.ADMIN)
