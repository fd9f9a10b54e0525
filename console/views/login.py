"""The login page: Django's LoginView behind the throttles of console/login_guard.py."""

import logging

from django.contrib.auth import views as auth_views
from django.shortcuts import render
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_protect

from console import login_guard

log = logging.getLogger(__name__)


@never_cache
@csrf_protect
def login(request):
    if request.method == "POST":
        username = request.POST.get("username", "").strip()
        address = login_guard.client_address(request)
        reason = login_guard.refusal(username, address)
        if reason:
            log.warning(
                "login refused before the password check: %s (%r from %s)",
                reason,
                username,
                address,
            )
            return render(
                request,
                "registration/login.html",
                {"refused": reason, "next": request.POST.get("next", "")},
                status=429,
            )
    return auth_views.LoginView.as_view()(request)
