"""Teams (admins): each team's scopes and members, with forms to add and remove them. The same
as the REST API's /teams, /team-scopes and /team-memberships (docs/security.md, "Teams")."""

from django import forms
from django.contrib import messages as flash
from django.contrib.auth import get_user_model
from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from console.access import admin_required
from recovery.models import Activity, Membership, Team, TeamScope


class TeamForm(forms.ModelForm):
    class Meta:
        model = Team
        fields = ["name"]


class TeamScopeForm(forms.ModelForm):
    """Model validation runs here: a bad pattern, or none at all, is a form error."""

    class Meta:
        model = TeamScope
        fields = ["team", "vhost", "queue_pattern", "exchange_pattern"]


class MembershipForm(forms.ModelForm):
    user = forms.ModelChoiceField(
        queryset=get_user_model().objects.filter(is_active=True).order_by("username"),
        to_field_name="username",
    )

    class Meta:
        model = Membership
        fields = ["team", "user", "role", "bodies", "unmask", "export"]
        labels = {
            "bodies": "Reads bodies (off: metadata only)",
            "unmask": "May unmask (break-glass, with a reason)",
            "export": "May export",
        }


FORMS = {"team": TeamForm, "scope": TeamScopeForm, "member": MembershipForm}


@login_required
@admin_required
@require_http_methods(["GET", "POST"])
def team_list(request):
    kind = request.POST.get("form") if request.method == "POST" else None
    bound = {name: form(prefix=name) for name, form in FORMS.items()}
    if kind in FORMS:
        bound[kind] = FORMS[kind](request.POST, prefix=kind)
        if bound[kind].is_valid():
            saved = bound[kind].save()
            Activity.record(
                request.user,
                f"{'team' if kind == 'team' else 'team_' + kind}_created",
                saved,
                via="console",
            )
            flash.success(request, f"Saved {saved}.")
            return redirect("teams")
    teams = Team.objects.prefetch_related("scopes", "memberships__user")
    return render(request, "teams.html", {"teams": teams, "forms": bound, "failed": kind})


DELETABLE = {"team": Team, "scope": TeamScope, "member": Membership}


@login_required
@admin_required
@require_POST
def team_delete(request, what, pk):
    if what not in DELETABLE:
        raise Http404(what)
    obj = get_object_or_404(DELETABLE[what], pk=pk)
    Activity.record(
        request.user, f"{'team' if what == 'team' else 'team_' + what}_deleted", obj, via="console"
    )
    obj.delete()
    flash.success(request, f"Removed {obj}.")
    return redirect("teams")
