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
        response.setdefault("Content-Security-Policy", self.DOCS_POLICY if docs else self.POLICY)
        return response
