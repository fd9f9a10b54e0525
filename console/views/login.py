"""The login page: Django's LoginView behind the throttles of recovery/access/throttle.py."""

import logging

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth import views as auth_views
from django.shortcuts import render
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_protect

from console import sso
from recovery.access import throttle

log = logging.getLogger(__name__)


def _context():
    """What the login page shows besides the form: the provider's button, who may use a
    password (LOCAL_LOGIN)."""
    return {
        "sso_enabled": sso.enabled(),
        "provider_name": settings.OIDC_PROVIDER_NAME,
        "local_login": settings.LOCAL_LOGIN,
    }


def _possible_username(username):
    field = get_user_model()._meta.get_field("username")
    return "\x00" not in username and len(username) <= field.max_length


@never_cache
@csrf_protect
def login(request):
    if request.method == "POST":
        username = request.POST.get("username", "").strip()
        if not _possible_username(username):
            # No account has it, and django-axes would fail to record it (a NUL, or longer
            # than its column): refused here, before the throttle and the password check.
            return render(
                request,
                "registration/login.html",
                {"refused": "Not a username.", "next": "", **_context()},
                status=400,
            )
        address = throttle.client_address(request)
        reason = throttle.refusal(username, address)
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
                {"refused": reason, "next": request.POST.get("next", ""), **_context()},
                status=429,
            )
    return auth_views.LoginView.as_view(extra_context=_context())(request)
