"""Password logins: Django's ModelBackend, for superusers only under LOCAL_LOGIN=superusers
(everyone else signs in through the identity provider; docs/security.md, "Single sign-on")."""

from django.conf import settings
from django.contrib.auth.backends import ModelBackend


class LocalLoginBackend(ModelBackend):
    def user_can_authenticate(self, user):
        if settings.LOCAL_LOGIN == "superusers" and not user.is_superuser:
            return False
        return super().user_can_authenticate(user)


class SsoBackend(ModelBackend):
    """The backend of sessions opened by a provider sign-in (console/sso.py): it checks no
    password (``authenticate`` gives nobody), and keeps those sessions' users while they are
    active, whatever LOCAL_LOGIN says."""

    def authenticate(self, request, username=None, password=None, **kwargs):
        return None
