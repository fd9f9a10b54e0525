"""Users and roles (admins only): create, set the role, deactivate, reactivate."""

from axes.utils import reset
from django import forms
from django.contrib import messages as flash
from django.contrib.auth import get_user_model
from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_http_methods, require_POST

from console.access import admin_required
from console.forms.people import RoleForm, UserCreateForm
from recovery.access import throttle
from recovery.models import (
    Activity,
    ApiToken,
    Privilege,
    Role,
    global_privileges_of,
    role_of,
    set_privileges,
    set_role,
)


class UnlockForm(forms.Form):
    """What a lockout is lifted for: read through a form, as django-axes' columns take them (a
    NUL byte, a 256-character name or an address that is none was a 500)."""

    username = forms.CharField(required=False, max_length=255)
    ip_address = forms.GenericIPAddressField(required=False)


def _privileges(user):
    granted = global_privileges_of(user, role_of(user))
    return {p.value: p in granted for p in Privilege}


def _users():
    users = (
        get_user_model()
        .objects.prefetch_related("groups")
        .select_related("sso_identity")
        .order_by("username")
    )
    return [
        {
            "user": u,
            "role": role_of(u),
            "form": RoleForm(initial={"role": role_of(u)}),
            "privileges": _privileges(u),
            "in_teams": u.memberships.exists(),
        }
        for u in users
    ]


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
            Activity.record(
                request.user,
                "user_created",
                detail={"username": user.get_username(), "role": data["role"]},
                via="console",
            )
        flash.success(request, f"Created {user.get_username()} ({data['role']}).")
        return redirect("users")
    return render(
        request,
        "users.html",
        {"form": form, "users": _users(), "roles": list(Role), "lockouts": throttle.lockouts()},
    )


def _refuse_self(request, user, what):
    """An admin cannot lock themselves out; another admin has to do it."""
    if user.pk == request.user.pk:
        flash.error(request, f"You cannot {what} your own account.")
        return True
    return False


def _refuse_superuser(request, user):
    """Only a superuser may change a superuser (an admin role is not enough)."""
    if user.is_superuser and not request.user.is_superuser:
        flash.error(request, f"Only a superuser may change {user.get_username()}, a superuser.")
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
    if _refuse_superuser(request, user):
        return redirect("users")
    if role != Role.ADMIN and _refuse_self(request, user, "demote"):
        return redirect("users")
    if user.is_superuser and role != Role.ADMIN:
        flash.error(request, f"{user.get_username()} is a superuser and always an admin.")
        return redirect("users")
    previous = role_of(user)
    with transaction.atomic():
        set_role(user, role)
        Activity.record(
            request.user,
            "role_changed",
            detail={"username": user.get_username(), "role": role, "previous": previous},
            via="console",
        )
    flash.success(request, f"{user.get_username()} is now {role}.")
    return redirect("users")


@login_required
@admin_required
@require_POST
def user_privileges(request, pk):
    """A user's global privileges (docs/security.md, "Private data"): bodies, unmask, export.
    Admins and superusers hold all three whatever is set here."""
    user = get_object_or_404(get_user_model(), pk=pk)
    if _refuse_superuser(request, user):
        return redirect("users")
    wanted = {p.value: request.POST.get(p.value) == "on" for p in Privilege}
    previous = _privileges(user)
    with transaction.atomic():
        set_privileges(user, **wanted)
        Activity.record(
            request.user,
            "privileges_changed",
            detail={"username": user.get_username(), "privileges": wanted, "previous": previous},
            via="console",
        )
    flash.success(request, f"{user.get_username()}'s privileges saved.")
    return redirect("users")


@login_required
@admin_required
@require_POST
def user_active(request, pk):
    user = get_object_or_404(get_user_model(), pk=pk)
    value = request.POST.get("active")
    if value not in ("0", "1"):
        flash.error(request, "active must be 1 (reactivate) or 0 (deactivate).")
        return redirect("users")
    active = value == "1"
    if _refuse_superuser(request, user):
        return redirect("users")
    if not active and _refuse_self(request, user, "deactivate"):
        return redirect("users")
    revoked = 0
    with transaction.atomic():
        user.is_active = active
        user.save(update_fields=["is_active"])
        if not active:
            # Revoked, not just suspended: reactivating the user must not revive old tokens.
            revoked = ApiToken.objects.filter(user=user, revoked_at__isnull=True).update(
                revoked_at=timezone.now()
            )
        detail = {} if active else {"tokens_revoked": revoked}
        Activity.record(
            request.user,
            "user_activated" if active else "user_deactivated",
            detail={"username": user.get_username(), **detail},
            via="console",
        )
    verb = "reactivated" if active else f"deactivated; {revoked} API token(s) revoked"
    flash.success(request, f"{user.get_username()} {verb}.")
    return redirect("users")


@login_required
@admin_required
@require_POST
def user_unlock(request):
    """Lift a login lockout (django-axes' records): a username at an address, a username
    everywhere (its slow-down too), or an address for every username."""
    form = UnlockForm(request.POST)
    if not form.is_valid():
        flash.error(request, "; ".join(f"{k}: {' '.join(v)}" for k, v in form.errors.items()))
        return redirect("users")
    username, address = form.cleaned_data["username"], form.cleaned_data["ip_address"] or ""
    if not (username or address):
        flash.error(request, "Give a username or a client address to unlock.")
        return redirect("users")
    cleared = reset(username=username or None, ip=address or None)
    Activity.record(
        request.user,
        "login_unlocked",
        detail={"username": username, "ip_address": address, "attempts_cleared": cleared},
        via="console",
    )
    flash.success(request, f"Unlocked {' at '.join(x for x in (username, address) if x)}.")
    return redirect("users")
