"""Permission checks for console views, in one place (403, never a hidden-button-only check)."""

from functools import wraps

from django.core.exceptions import PermissionDenied

from recovery.models import Role, scope_of


def role_required(role):
    """The caller's role: their global one, or while they are in a team their strongest team
    role (``Scope``, computed once per request and reused by the view)."""

    def decorator(view):
        @wraps(view)
        def wrapper(request, *args, **kwargs):
            if not scope_of(request).has_role(role):
                raise PermissionDenied(f"requires the {role} role")
            return view(request, *args, **kwargs)

        return wrapper

    return decorator


operator_required = role_required(Role.OPERATOR)
viewer_required = role_required(Role.VIEWER)
admin_required = role_required(Role.ADMIN)
