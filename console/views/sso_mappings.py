"""Single sign-on's group mappings (admins): which provider group gives which global role, or
which role in which team (recovery.access.sso; docs/security.md, "Single sign-on"). Applied at
each user's next sign-in."""

from django import forms
from django.conf import settings
from django.contrib import messages as flash
from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from console import sso
from console.access import admin_required
from recovery.models import Activity, GroupMapping, SsoIdentity


class GroupMappingForm(forms.ModelForm):
    """Model validation runs here: a global role or a team with a role, never both or neither;
    a group mapped twice the same way is a form error (the unique constraints)."""

    class Meta:
        model = GroupMapping
        fields = ["group", "role", "team", "team_role"]
        labels = {
            "group": "Provider group",
            "role": "Global role",
            "team_role": "Role in the team",
        }
        help_texts = {
            "group": "a value of the groups claim, exactly (case included)",
            "role": "or leave empty and choose a team",
        }


@login_required
@admin_required
@require_http_methods(["GET", "POST"])
def mapping_list(request):
    form = GroupMappingForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        mapping = form.save()
        Activity.record(request.user, "sso_mapping_created", mapping, via="console")
        flash.success(request, f"Mapped {mapping}. It applies at each user's next sign-in.")
        return redirect("sso-mappings")
    context = {
        "form": form,
        "mappings": GroupMapping.objects.select_related("team"),
        "identities": SsoIdentity.objects.select_related("user").order_by("user__username"),
        "sso_enabled": sso.enabled(),
        "settings": {
            "issuer": settings.OIDC_ISSUER,
            "client_id": settings.OIDC_CLIENT_ID,
            "scopes": " ".join(settings.OIDC_SCOPES),
            "groups_claim": settings.OIDC_GROUPS_CLAIM,
            "username_claim": settings.OIDC_USERNAME_CLAIM,
            "local_login": settings.LOCAL_LOGIN,
        },
    }
    return render(request, "sso_mappings.html", context, status=400 if form.errors else 200)


@login_required
@admin_required
@require_POST
def mapping_delete(request, pk):
    mapping = get_object_or_404(GroupMapping, pk=pk)
    Activity.record(request.user, "sso_mapping_deleted", mapping, via="console")
    mapping.delete()
    flash.success(request, f"Removed {mapping}. It applies at each user's next sign-in.")
    return redirect("sso-mappings")
