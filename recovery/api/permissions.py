from rest_framework import permissions

from recovery.models import Role, has_role


class RolePermission(permissions.BasePermission):
    """Viewers read; operators also replay/discard/start jobs; admins also manage users/tokens.

    A view may set ``required_role`` to demand more than the method implies.
    """

    message = "Your role does not allow this."

    def has_permission(self, request, view):
        if not request.user or not request.user.is_authenticated:
            return False
        required = getattr(self, "required", None) or getattr(view, "required_role", None)
        if required is None:
            required = Role.VIEWER if request.method in permissions.SAFE_METHODS else Role.OPERATOR
        return has_role(request.user, required)


def requires(role):
    """A permission class demanding ``role`` whatever the method (e.g. a POST that only reads)."""
    return type(f"Requires{Role(role).label}", (RolePermission,), {"required": Role(role)})
