"""Who gets which role and team membership at a single sign-on (docs/security.md, "Single
sign-on"): the provisioning half of sign-in. The OpenID Connect protocol, and reading the id
token's claims into an ``Account``, are the console's (console/sso.py).

At the domain floor: it creates users, links provider accounts to them and applies what their
groups are mapped to (recovery.access.sso: ``Grant``, ``SsoIdentity.apply``), or refuses with a
reason in the activity log.
"""

import logging
from dataclasses import dataclass

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.utils import timezone

from recovery.access.models import Activity, set_privileges
from recovery.access.sso import Grant, SsoIdentity, log_refusal

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Account:
    """A provider account as its validated id token describes it. ``groups`` None: the provider
    sent no groups claim; ``email_verified``: the provider vouches the email is this account's."""

    issuer: str
    subject: str
    username: str
    groups: list | None
    email: str = ""
    email_verified: bool = False


class Refused(Exception):
    """A sign-in the mapping refuses: the page says ``reason``; it is in the activity log."""

    def __init__(self, reason, username=""):
        super().__init__(reason)
        self.reason = reason
        self.username = username


def sign_in(account):
    """The Lazarus user ``account`` signs in as, with their mapped role and teams applied;
    raises Refused (logged in the activity log)."""
    outcome = _decide(account)
    if isinstance(outcome, Refused):
        raise outcome
    return outcome


@transaction.atomic
def _decide(account):
    """The user, or the Refused the caller raises once the refusal is committed."""
    username, groups = account.username, account.groups
    identity = (
        SsoIdentity.objects.select_for_update()
        .select_related("user")
        .filter(issuer=account.issuer, subject=account.subject)
        .first()
    )
    if groups is None:
        reason = (
            f"The identity provider sent no {settings.OIDC_GROUPS_CLAIM!r} claim, so Lazarus "
            "cannot tell which role and team you have. An administrator must configure the "
            "provider to send it (docs/security.md, 'Single sign-on')."
        )
        return _refuse(username, reason, identity, [])
    grant = Grant.of(groups)
    if grant.empty:
        reason = (
            "None of your groups at the identity provider is mapped to a Lazarus role or team "
            f"({'you are in: ' + ', '.join(sorted(groups)) if groups else 'you are in no group'}). "
            "Ask a Lazarus administrator to map one of them, or your provider's administrator "
            "to add you to a mapped group."
        )
        return _refuse(username, reason, identity, groups)
    if identity is None:
        identity = _first_sign_in(account)
        if isinstance(identity, Refused):
            return identity
    user = identity.user
    if not user.is_active:
        return _refuse(
            user.username,
            "Your Lazarus account has been deactivated by an administrator.",
            identity,
            groups,
            take_away=False,
        )
    grant, removed_from = grant.without_removals(user)
    if grant.empty:
        return _refuse(
            user.username,
            f"A Lazarus administrator removed you from {', '.join(removed_from)}, the only team "
            "your groups give you. Ask them to add you again (Teams page).",
            identity,
            groups,
        )
    identity.groups = groups
    identity.last_login_at = timezone.now()
    identity.save(update_fields=["groups", "last_login_at"])
    identity.apply(grant)
    return user


def _first_sign_in(account):
    """The new SsoIdentity of a provider account Lazarus has not seen (by issuer and subject),
    or a Refused. The username claim only names a new user: many providers let users edit it,
    so it never links an account by itself (_link)."""
    issuer, subject, username = account.issuer, account.subject, account.username
    User = get_user_model()
    existing = User.objects.select_related("sso_identity").filter(username__iexact=username)
    if existing.exists():
        return _link(existing.first(), account)
    try:
        # Two first sign-ins of one person at once (two tabs): one creates the account, the
        # other finds it (the unique username and issuer+subject decide, not a 500).
        with transaction.atomic():
            user = User(username=username, email=account.email)
            user.set_unusable_password()
            user.save()
            # Least privileges for what sign-in creates: an admin grants bodies (Users page).
            set_privileges(user, bodies=False)
            identity = SsoIdentity.objects.create(user=user, issuer=issuer, subject=subject)
        log.info("sign-in: created user %r for %s at %s", username, subject, issuer)
        return identity
    except IntegrityError:
        identity = (
            SsoIdentity.objects.select_related("user")
            .filter(issuer=issuer, subject=subject)
            .first()
        )
        if identity is not None:
            return identity
        return _refuse(
            username,
            f"A Lazarus account named {username!r} was created for someone else at the "
            "same moment. An administrator must rename or remove it before you can "
            "sign in with the provider.",
            None,
            account.groups,
            subject=subject,
        )


def _email_verified(account, user):
    """The provider vouches (email_verified) that this account owns ``user``'s email address."""
    email = account.email
    return (
        account.email_verified
        and isinstance(email, str)
        and bool(user.email)
        and email.strip().casefold() == user.email.strip().casefold()
    )


def _link(user, account):
    """A provider account's first sign-in under the name of an existing Lazarus user: linked
    only when the user has no provider account yet, is not a superuser (break-glass accounts
    stay local) and the provider says the email address is verified and the user's. Otherwise a
    refusal that names the clash, in the activity log, never a silent take-over."""
    issuer, subject = account.issuer, account.subject
    claim = settings.OIDC_USERNAME_CLAIM
    if hasattr(user, "sso_identity"):
        reason = (
            f"The Lazarus account {user.username!r}, the name your {claim!r} claim gives you, "
            "already belongs to another account at the identity provider (it signed in with "
            "that name first). You are not signed in. Ask a Lazarus administrator to rename "
            "or remove that account (Users page); this refusal is in the activity log."
        )
    elif user.is_superuser:
        reason = (
            f"A Lazarus account named {user.username!r} exists already and is a superuser: it "
            "stays a local account (break-glass) and is never linked to the provider."
        )
    elif not _email_verified(account, user):
        reason = (
            f"A Lazarus account named {user.username!r} exists already, and the identity "
            "provider does not vouch that it is yours (it links only when the provider says "
            "your email address is verified and it is the account's). An administrator must "
            "set the account's email, or rename or remove it, before you can sign in."
        )
    else:
        identity = SsoIdentity.objects.create(user=user, issuer=issuer, subject=subject)
        Activity.record(
            user,
            "sso_linked",
            detail={"username": user.username, "issuer": issuer, "subject": subject},
            via="console",
        )
        log.info("sign-in: linked %r to %s at %s (verified email)", user.username, subject, issuer)
        return identity
    return _refuse(
        account.username, reason, None, account.groups, subject=subject, existing_user=user.pk
    )


def _refuse(username, reason, identity, groups, take_away=True, **extra):
    """Logs the refusal (``extra`` in the activity row's detail); a known user loses their
    roles, teams and API tokens (not for a deactivated user: an admin took them out already).
    Returns the Refused to raise once this is committed."""
    revoked = 0
    user = identity.user if identity is not None else None
    if identity is not None and take_away:
        revoked = identity.refuse(reason)
        identity.groups = groups
        identity.last_login_at = timezone.now()
        identity.save(update_fields=["groups", "last_login_at"])
    log_refusal(username, reason, user=user, groups=groups, revoked_tokens=revoked, **extra)
    log.warning(
        "sign-in refused for %r (groups %s): %s%s",
        username,
        groups,
        reason,
        f"; revoked {revoked} API token(s)" if revoked else "",
    )
    return Refused(reason, username)
