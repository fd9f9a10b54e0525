from urllib.parse import urlparse

from django.conf import settings
from django.http import Http404

from recovery.access.tokens import caller_scope


class ContentSecurityPolicyMiddleware:
    """Scripts and styles only from our own origin: an injected <script> in a body is inert.

    htmx needs no inline script or eval; its indicator styles are disabled (htmx-config meta)
    so no inline style is injected either.
    """

    POLICY = (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'; "
        "object-src 'none'"
    )

    # /api/docs/ (Swagger UI from drf-spectacular-sidecar, its init script a separate file via
    # SpectacularSwaggerSplitView): scripts still only from here; Swagger UI sets inline styles.
    DOCS_POLICY = POLICY.replace("style-src 'self'", "style-src 'self' 'unsafe-inline'")

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        docs = request.path.startswith("/api/docs")
        policy = self.DOCS_POLICY if docs else self.POLICY
        if settings.OIDC_ISSUER:
            # The logout form's POST is redirected to the identity provider's end-session
            # endpoint (RP-initiated logout), which form-action must allow.
            issuer = urlparse(settings.OIDC_ISSUER)
            policy = policy.replace(
                "form-action 'self'", f"form-action 'self' {issuer.scheme}://{issuer.netloc}"
            )
        response.setdefault("Content-Security-Policy", policy)
        return response


class TeamScopeMiddleware:
    """Fails closed for team callers: a console view answers a user in a team only when it is
    marked ``team_scoped`` (it reads and writes through ``Scope``); any other view, one added
    later included, is a 404 for them. Django's own views (login, admin: staff only) and the
    API schema carry no messages; API views are gated by ``RolePermission`` after their token
    is read. A console request with only an API token is judged by that token's scope (a
    team token is a team caller), though the view itself still sees no user."""

    EXEMPT_MODULES = ("django.", "drf_spectacular.")

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_view(self, request, view_func, view_args, view_kwargs):
        if hasattr(view_func, "cls") or getattr(view_func, "team_scoped", False):
            return None
        if view_func.__module__.startswith(self.EXEMPT_MODULES):
            return None
        # A token-only request is anonymous to the view, but it is judged by the token's
        # scope here: a team's token must not reach an unscoped view as "nobody".
        scope = caller_scope(request)
        if scope is None or scope.is_global:
            return None
        raise Http404("not available to team members")
