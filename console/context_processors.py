from recovery.models import Role, has_role


def roles(request):
    user = getattr(request, "user", None)
    return {
        "can_operate": has_role(user, Role.OPERATOR),
        "is_admin": has_role(user, Role.ADMIN),
    }
