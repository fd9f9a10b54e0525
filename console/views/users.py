"""Users and roles (admins only): create, set the role, deactivate, reactivate."""

from django.contrib import messages as flash
from django.contrib.auth import get_user_model
from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from console.access import admin_required
from console.forms import RoleForm, UserCreateForm
from recovery.models import Activity, Role, role_of, set_role


def _users():
    users = get_user_model().objects.prefetch_related("groups").order_by("username")
    return [
        {"user": u, "role": role_of(u), "form": RoleForm(initial={"role": role_of(u)})}
        for u in users
    ]


def _log(request, action, target, **detail):
    Activity.objects.create(
        user=request.user,
        action=action,
        via="console",
        detail={"username": target.get_username(), **detail},
    )


@login_required
@admin_required
@require_http_methods(["GET", "POST"])
def user_list(request):
    form = UserCreateForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        with transaction.atomic():
            user = get_user_model().objects.create_user(data["username"], password=data["password"])
            set_role(user, data["role"])
            _log(request, "user_created", user, role=data["role"])
        flash.success(request, f"Created {user.get_username()} ({data['role']}).")
        return redirect("users")
    return render(request, "users.html", {"form": form, "users": _users(), "roles": list(Role)})


def _refuse_self(request, user, what):
    """An admin cannot lock themselves out; another admin has to do it."""
    if user.pk == request.user.pk:
        flash.error(request, f"You cannot {what} your own account.")
        return True
    return False


@login_required
@admin_required
@require_POST
def user_role(request, pk):
    user = get_object_or_404(get_user_model(), pk=pk)
    form = RoleForm(request.POST)
    if not form.is_valid():
        flash.error(request, "Choose viewer, operator or admin.")
        return redirect("users")
    role = form.cleaned_data["role"]
    if role != Role.ADMIN and _refuse_self(request, user, "demote"):
        return redirect("users")
    if user.is_superuser and role != Role.ADMIN:
        flash.error(request, f"{user.get_username()} is a superuser and always an admin.")
        return redirect("users")
    previous = role_of(user)
    with transaction.atomic():
        set_role(user, role)
        _log(request, "role_changed", user, role=role, previous=previous)
    flash.success(request, f"{user.get_username()} is now {role}.")
    return redirect("users")


@login_required
@admin_required
@require_POST
def user_active(request, pk):
    user = get_object_or_404(get_user_model(), pk=pk)
    active = request.POST.get("active") == "1"
    if not active and _refuse_self(request, user, "deactivate"):
        return redirect("users")
    with transaction.atomic():
        user.is_active = active
        user.save(update_fields=["is_active"])
        # A deactivated user's API tokens stop working too (ApiToken.authenticate checks it).
        _log(request, "user_activated" if active else "user_deactivated", user)
    verb = "reactivated" if active else "deactivated"
    flash.success(request, f"{user.get_username()} {verb}.")
    return redirect("users")
