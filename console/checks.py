"""Deployment checks Django does not make itself (run by `manage.py check --deploy`)."""

from django.conf import settings
from django.core.checks import Error, Tags, register


@register(Tags.security, deploy=True)
def secret_key_is_not_the_development_key(app_configs, **kwargs):
    from console.settings import DEVELOPMENT_SECRET_KEY

    if settings.SECRET_KEY == DEVELOPMENT_SECRET_KEY:
        return [
            Error(
                "SECRET_KEY is the development key published in the source code.",
                hint="Set the SECRET_KEY environment variable to a long random value.",
                id="lazarus.E001",
            )
        ]
    return []


@register(Tags.security, deploy=True)
def console_policy_is_installed(app_configs, **kwargs):
    """Bodies and headers are attacker-controlled: the CSP is the second wall after escaping."""
    if "console.middleware.ContentSecurityPolicyMiddleware" not in settings.MIDDLEWARE:
        return [
            Error(
                "The Content-Security-Policy middleware is not installed.",
                hint="Keep console.middleware.ContentSecurityPolicyMiddleware in MIDDLEWARE.",
                id="lazarus.E002",
            )
        ]
    return []
