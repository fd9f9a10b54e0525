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

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if not request.path.startswith("/api/docs"):
            response.setdefault("Content-Security-Policy", self.POLICY)
        return response
