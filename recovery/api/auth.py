import hmac

from django.conf import settings
from django.utils.translation import gettext_lazy as _
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions

from recovery.models import ApiToken, Scope, scope_of


class HashedTokenAuthentication(authentication.TokenAuthentication):
    """``Authorization: Token <key>``; only the key's SHA-256 is stored (recovery.ApiToken)."""

    def authenticate_credentials(self, key):
        token = ApiToken.authenticate(key)
        if token is None:
            raise exceptions.AuthenticationFailed(_("Invalid or revoked token."))
        return token.user, token


class HashedTokenScheme(OpenApiAuthenticationExtension):
    target_class = "recovery.api.auth.HashedTokenAuthentication"
    name = "tokenAuth"

    def get_security_definition(self, auto_schema):
        return {
            "type": "apiKey",
            "in": "header",
            "name": "Authorization",
            "description": "`Token <key>`; create one with `manage.py create_api_token USER`",
        }


NO_TOKEN = object()
# A token header that names no usable token: neither anonymous nor any caller.
INVALID = "invalid"


def token_of(request):
    """The ApiToken a plain Django request (a console view's) carries, resolved once: None
    without an ``Authorization: Token`` header, ``INVALID`` for a key that is unknown,
    revoked, or of an inactive user. Console views never act as a token's user (they keep
    their session's, anonymous included); this is for the gates that must judge a token
    anyway (console.middleware.TeamScopeMiddleware, /metrics, /healthz, /readyz)."""
    cached = getattr(request, "_lazarus_token", NO_TOKEN)
    if cached is not NO_TOKEN:
        return cached
    try:
        found = HashedTokenAuthentication().authenticate(request)
    except exceptions.AuthenticationFailed:
        found = INVALID
    token = found[1] if isinstance(found, tuple) else found
    request._lazarus_token = token
    return token


def caller_scope(request):
    """The Scope of whoever a console request comes from: its session user's, else its API
    token's (acting as the token's team, if it has one), else None (anonymous, or a bad
    token). A token is judged with its team, so a team token is never taken for a global
    caller."""
    if request.user.is_authenticated:
        return scope_of(request)
    token = token_of(request)
    if token is None or token is INVALID:
        return None
    cached = getattr(request, "_lazarus_token_scope", None)
    if cached is None:
        cached = request._lazarus_token_scope = Scope.of(token.user, token.team_id)
    return cached


def is_monitoring(request):
    """Whether the request carries MONITORING_TOKEN (``Authorization: Token <it>``): a
    secret for a monitoring system that reads /metrics in full and the details of /healthz
    and /readyz, and nothing else (it is no user and opens no other page or API)."""
    expected = settings.MONITORING_TOKEN
    if not expected:
        return False
    header = request.META.get("HTTP_AUTHORIZATION", "")
    scheme, _, key = header.partition(" ")
    return scheme == "Token" and hmac.compare_digest(key.strip().encode(), expected.encode())
