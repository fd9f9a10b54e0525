"""Decoder rules (admins): how a queue's bodies are read when their properties do not say."""

from django.contrib import messages as flash
from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from console.access import admin_required
from console.forms.decoders import DecoderRuleForm
from recovery.models import Activity, DecoderRule


@login_required
@admin_required
@require_http_methods(["GET", "POST"])
def decoder_list(request):
    form = DecoderRuleForm(request.POST or None, request.FILES or None)
    if request.method == "POST" and form.is_valid():
        with transaction.atomic():
            rule = form.save(commit=False)
            rule.created_by = request.user
            rule.save()
            Activity.record(request.user, "decoder_rule_created", rule, via="console")
        flash.success(
            request,
            f"Decoder rule {rule.name} saved. Messages indexed before it keep their search text "
            "until `manage.py index_search --all` runs again.",
        )
        return redirect("decoders")
    return render(
        request,
        "decoders.html",
        {"form": form, "rules": DecoderRule.objects.select_related("created_by")},
        status=400 if form.errors else 200,
    )


@login_required
@admin_required
@require_POST
def decoder_delete(request, pk):
    rule = get_object_or_404(DecoderRule, pk=pk)
    with transaction.atomic():
        Activity.record(request.user, "decoder_rule_deleted", rule, via="console")
        rule.delete()
    flash.success(request, f"Decoder rule {rule.name} deleted.")
    return redirect("decoders")
