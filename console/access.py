"""Permission checks for console views, in one place (403, never a hidden-button-only check)."""

from functools import wraps

from django.core.exceptions import PermissionDenied

from recovery.models import Role, has_role


def role_required(role):
    def decorator(view):
        @wraps(view)
        def wrapper(request, *args, **kwargs):
            if not has_role(request.user, role):
                raise PermissionDenied(f"requires the {role} role")
            return view(request, *args, **kwargs)

        return wrapper

    return decorator


operator_required = role_required(Role.OPERATOR)
viewer_required = role_required(Role.VIEWER)
admin_required = role_required(Role.ADMIN)
