"""DRF's side of API tokens: the authentication class and its schema entry, over
``ApiToken.authenticate`` (recovery.access; a console request's token is judged by
recovery.access.tokens)."""

from django.utils.translation import gettext_lazy as _
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions

from recovery.access.models import ApiToken


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
