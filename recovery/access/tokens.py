"""The API token a request carries, judged once per request, and the monitoring token.

At the domain floor (it reads requests). DRF's authentication class (recovery.api.auth) is
glue over ``ApiToken.authenticate``; the console's gates (console.middleware, /metrics,
/healthz, /readyz) judge a token here, with the same header rules as DRF's
``TokenAuthentication`` (``Authorization: Token <key>``).
"""

import hmac

from django.conf import settings

from recovery.access.models import ApiToken
from recovery.access.scope import Scope, scope_of

NO_TOKEN = object()
# A token header that names no usable token: neither anonymous nor any caller.
INVALID = "invalid"
KEYWORD = "token"


def key_of(request):
    """The key of an ``Authorization: Token <key>`` header; None without one, INVALID for a
    malformed one (no key, spaces in it, not text), as DRF's TokenAuthentication reads it."""
    header = request.META.get("HTTP_AUTHORIZATION", "")
    if isinstance(header, str):
        header = header.encode("iso-8859-1", errors="replace")
    parts = header.split()
    if not parts or parts[0].lower() != KEYWORD.encode():
        return None
    if len(parts) != 2:
        return INVALID
    try:
        return parts[1].decode()
    except UnicodeError:
        return INVALID


def token_of(request):
    """The ApiToken a plain Django request (a console view's) carries, resolved once: None
    without an ``Authorization: Token`` header, ``INVALID`` for a key that is unknown,
    revoked, or of an inactive user. Console views never act as a token's user (they keep
    their session's, anonymous included); this is for the gates that must judge a token
    anyway (console.middleware.TeamScopeMiddleware, /metrics, /healthz, /readyz)."""
    cached = getattr(request, "_lazarus_token", NO_TOKEN)
    if cached is not NO_TOKEN:
        return cached
    key = key_of(request)
    token = key if key is None or key is INVALID else (ApiToken.authenticate(key) or INVALID)
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
