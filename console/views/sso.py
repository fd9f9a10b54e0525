"""Signing in and out through the identity provider (console/sso.py): the redirect to the
provider, its answer (the callback), and logout, which ends the provider's session too where it
offers RP-initiated logout (an end_session_endpoint)."""

import logging
from urllib.parse import urlencode

from django.conf import settings
from django.contrib import messages as flash
from django.contrib.auth import login as auth_login
from django.contrib.auth import logout as auth_logout
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_POST

from console import sso
from recovery.access.provisioning import Refused
from recovery.models import team_scoped

log = logging.getLogger(__name__)

NEXT_KEY = "sso_next"
ID_TOKEN_KEY = "sso_id_token"


def _failed(request, error):
    log.warning("sign-in failed: %s (%s)", error.title, error.cause or error.detail)
    return render(
        request,
        "registration/sso_error.html",
        {"error": error, "provider_name": settings.OIDC_PROVIDER_NAME},
        status=error.status,
    )


# These views carry no messages: team members use them too (console.middleware.TeamScopeMiddleware
# answers only views marked team_scoped to them).
@team_scoped
@never_cache
@require_GET
def sso_login(request):
    if not sso.enabled():
        raise Http404("single sign-on is not configured (OIDC_ISSUER)")
    next_url = request.GET.get("next", "")
    if not url_has_allowed_host_and_scheme(
        next_url, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        next_url = ""
    request.session[NEXT_KEY] = next_url
    try:
        return sso.client().authorize_redirect(
            request, request.build_absolute_uri(reverse("sso-callback"))
        )
    except Exception as exc:  # explain() re-raises what it does not know
        return _failed(request, sso.explain(exc))


@team_scoped
@never_cache
@require_GET
def sso_callback(request):
    if not sso.enabled():
        raise Http404("single sign-on is not configured (OIDC_ISSUER)")
    try:
        token = sso.client().authorize_access_token(
            request, leeway=settings.OIDC_CLOCK_LEEWAY_SECONDS
        )
        user = sso.sign_in(sso.claims_of(token))
    except Refused as refused:
        return render(
            request,
            "registration/sso_refused.html",
            {"reason": refused.reason, "provider_name": settings.OIDC_PROVIDER_NAME},
            status=403,
        )
    except Exception as exc:
        return _failed(request, sso.explain(exc))
    next_url = request.session.pop(NEXT_KEY, "")
    auth_login(request, user, backend="console.auth_backends.SsoBackend")
    request.session[ID_TOKEN_KEY] = token["id_token"]
    log.info("sign-in: %r through %s", user.get_username(), settings.OIDC_ISSUER)
    return redirect(next_url or settings.LOGIN_REDIRECT_URL)


@team_scoped
@require_POST
def logout(request):
    """Ends the Lazarus session; a provider sign-in is then sent to the provider's
    end_session_endpoint (with the id token as hint), which comes back to the login page."""
    id_token = request.session.get(ID_TOKEN_KEY)
    auth_logout(request)
    if not (id_token and sso.enabled()):
        return redirect(settings.LOGOUT_REDIRECT_URL)
    try:
        end_session = sso.client().load_server_metadata().get("end_session_endpoint")
    except Exception as exc:
        error = sso.explain(exc)
        log.warning("logout: the provider's session was not ended: %s (%s)", error, error.cause)
        flash.warning(
            request,
            "You are logged out of Lazarus, but the identity provider could not be reached to "
            f"end your session there ({error.title.lower()}).",
        )
        return redirect(settings.LOGOUT_REDIRECT_URL)
    if not end_session:
        return redirect(settings.LOGOUT_REDIRECT_URL)
    params = {
        "id_token_hint": id_token,
        "client_id": settings.OIDC_CLIENT_ID,
        "post_logout_redirect_uri": request.build_absolute_uri(reverse("login")),
    }
    return redirect(end_session + ("&" if "?" in end_session else "?") + urlencode(params))
