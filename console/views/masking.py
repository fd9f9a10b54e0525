"""Masking rules (admins): what is hidden wherever message content is shown
(docs/security.md, "Private data")."""

from django.conf import settings
from django.contrib import messages as flash
from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from console.access import admin_required
from console.forms.masking import MaskRuleForm
from recovery.masking.trial import sample_matches
from recovery.models import Activity, MaskRule


@login_required
@admin_required
@require_http_methods(["GET", "POST"])
def masking_list(request):
    form = MaskRuleForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        with transaction.atomic():
            rule = form.save(commit=False)
            rule.created_by = request.user
            rule.save()
            Activity.record(request.user, "mask_rule_created", rule, via="console")
        flash.success(request, f"Masking rule saved: {rule}.")
        return redirect("masking")
    rules = list(MaskRule.objects.select_related("team", "created_by"))
    matches = sample_matches(rules)
    for rule in rules:
        rule.broken = matches.get(rule.pk, (0, 0)) is None
        rule.matched, rule.looked_at = matches.get(rule.pk) or (0, 0)
    return render(
        request,
        "masking.html",
        {"form": form, "rules": rules, "sample_size": settings.MASK_RULE_SAMPLE},
        status=400 if form.errors else 200,
    )


@login_required
@admin_required
@require_POST
def masking_delete(request, pk):
    rule = get_object_or_404(MaskRule.objects.select_related("team"), pk=pk)
    with transaction.atomic():
        Activity.record(request.user, "mask_rule_deleted", rule, via="console")
        rule.delete()
    flash.success(request, f"Masking rule deleted: {rule}.")
    return redirect("masking")
