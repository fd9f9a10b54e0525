"""Single sign-on with an OpenID Connect provider: the authorization code flow with PKCE (S256)
through Authlib (docs/decisions.md says why Authlib), and what a sign-in may fail on.

``client()`` is the provider, discovered from ``OIDC_ISSUER`` (its metadata and keys are kept by
the process for an hour; an unknown key id fetches the keys again, so the provider may rotate
them).
``SignInError`` is every way a sign-in fails, each with a page of its own and a log line:
``explain()`` turns what Authlib, joserfc and requests raise into one. ``sign_in()`` reads the
id token's claims (username, groups, email) and hands them to recovery.access.provisioning, which
decides who that is in Lazarus and which role and teams their groups give, or refuses.
"""

import logging
import time
from dataclasses import dataclass
from typing import Any

import requests
from authlib.integrations.base_client import MismatchingStateError, OAuthError
from authlib.integrations.django_client import OAuth
from django.conf import settings
from django.contrib.auth.validators import UnicodeUsernameValidator
from django.core.exceptions import ValidationError
from joserfc import errors as joserfc_errors

from recovery.access import provisioning

log = logging.getLogger(__name__)

NAME = "lazarus"
# The provider's discovery document and keys are read again after this long (a key id not seen
# before fetches the keys at once).
METADATA_MAX_AGE_SECONDS = 3600
_clients: dict[tuple, Any] = {}


def enabled():
    return bool(settings.OIDC_ISSUER)


def discovery_url():
    return settings.OIDC_ISSUER.rstrip("/") + "/.well-known/openid-configuration"


def client():
    """The provider's Authlib client for the current settings (one per process and setting)."""
    key = (
        settings.OIDC_ISSUER,
        settings.OIDC_CLIENT_ID,
        settings.OIDC_CLIENT_SECRET,
        tuple(settings.OIDC_SCOPES),
        settings.OIDC_TIMEOUT_SECONDS,
    )
    found = _clients.get(key)
    if found is None:
        oauth = OAuth()
        found = oauth.register(
            name=NAME,
            client_id=settings.OIDC_CLIENT_ID,
            client_secret=settings.OIDC_CLIENT_SECRET,
            server_metadata_url=discovery_url(),
            client_kwargs={
                "scope": " ".join(settings.OIDC_SCOPES),
                "code_challenge_method": "S256",
                "default_timeout": settings.OIDC_TIMEOUT_SECONDS,
            },
        )
        _clients[key] = found
    loaded_at = found.server_metadata.get("_loaded_at")
    if loaded_at is not None and time.time() - loaded_at > METADATA_MAX_AGE_SECONDS:
        found.server_metadata = {}
    return found


@dataclass
class SignInError(Exception):
    """A sign-in that did not happen: ``title`` and ``detail`` for the page, ``status`` for the
    response, ``cause`` for the log line."""

    title: str
    detail: str
    status: int = 502
    cause: str = ""

    def __str__(self):
        return f"{self.title}: {self.detail}"


def _provider_unreachable(exc):
    if isinstance(exc, requests.Timeout):
        return SignInError(
            "The identity provider did not answer in time",
            f"{settings.OIDC_ISSUER} did not answer within {settings.OIDC_TIMEOUT_SECONDS:g} "
            "seconds (OIDC_TIMEOUT_SECONDS). It may be down or overloaded: try again in a "
            "moment, or ask whoever runs it.",
            504,
        )
    if isinstance(exc, requests.HTTPError) and exc.response is not None:
        return SignInError(
            "The identity provider answered with an error",
            f"{exc.response.url} answered HTTP {exc.response.status_code}. Check OIDC_ISSUER, "
            "or ask whoever runs the provider.",
        )
    if isinstance(exc, ValueError):
        return SignInError(
            "The identity provider's answer is not JSON",
            f"Lazarus could not read what {settings.OIDC_ISSUER} sent (is OIDC_ISSUER the "
            "provider's issuer URL?).",
        )
    return SignInError(
        "The identity provider cannot be reached",
        f"Lazarus could not connect to {settings.OIDC_ISSUER}. It may be down, or OIDC_ISSUER "
        "may be wrong.",
    )


def _oauth_error(exc):
    error = getattr(exc, "error", "") or ""
    description = getattr(exc, "description", "") or ""
    if isinstance(exc, MismatchingStateError):
        return SignInError(
            "This sign-in does not belong to this browser session",
            "The answer from the identity provider carries a state Lazarus did not send from "
            "this browser (an old tab, a second sign-in meanwhile, or a forged link). Start "
            "again from the login page.",
            400,
        )
    if error == "invalid_client":
        return SignInError(
            "The identity provider refused Lazarus's client credentials",
            "The provider did not accept OIDC_CLIENT_ID and OIDC_CLIENT_SECRET "
            f"({description or error}). An administrator must fix them.",
        )
    if error == "invalid_grant":
        return SignInError(
            "The identity provider refused the sign-in code",
            "The code was used already, has expired, or does not match this browser's PKCE "
            f"verifier ({description or error}). Start again from the login page.",
            400,
        )
    if error in ("access_denied", "login_required", "consent_required", "interaction_required"):
        return SignInError(
            "The identity provider did not sign you in",
            f"It answered {error}{': ' + description if description else ''}.",
            403,
        )
    return SignInError(
        "The identity provider answered with an error",
        f"{error or 'error'}{': ' + description if description else ''}",
    )


def _token_error(exc):
    """The id token failed a check: its signature, its nonce, its times, its claims."""
    if isinstance(
        exc,
        (
            joserfc_errors.BadSignatureError,
            joserfc_errors.InvalidKeyIdError,
            joserfc_errors.MissingKeyError,
        ),
    ):
        return SignInError(
            "The id token is not signed by the identity provider",
            "Its signature does not verify with any key the provider publishes (its jwks_uri). "
            "Lazarus does not trust it. If the provider rotated its keys, try again; otherwise "
            "someone may be forging tokens.",
        )
    if isinstance(exc, joserfc_errors.ExpiredTokenError):
        return SignInError(
            "The id token has expired already",
            "The provider's clock is behind this server's by more than "
            f"OIDC_CLOCK_LEEWAY_SECONDS ({settings.OIDC_CLOCK_LEEWAY_SECONDS} s), or the token "
            "is old. Check both clocks (NTP).",
            400,
        )
    claim = getattr(exc, "claim", "") or ""
    if claim in ("iat", "nbf") and isinstance(exc, joserfc_errors.InvalidClaimError):
        return SignInError(
            "The id token is dated in the future",
            f"{exc.description}: the provider's clock is ahead of this server's by more than "
            f"OIDC_CLOCK_LEEWAY_SECONDS ({settings.OIDC_CLOCK_LEEWAY_SECONDS} s). Check both "
            "clocks (NTP).",
            400,
        )
    if claim == "nonce":
        return SignInError(
            "The id token was not issued for this sign-in",
            "Its nonce is not the one Lazarus sent (a replayed or swapped token). Start again "
            "from the login page.",
            400,
        )
    if claim:
        return SignInError(
            "The id token is not acceptable",
            f"Its {claim!r} claim is "
            f"{'missing' if isinstance(exc, joserfc_errors.MissingClaimError) else 'wrong'} "
            "(iss must be OIDC_ISSUER, aud OIDC_CLIENT_ID).",
        )
    return SignInError("The id token is not acceptable", str(exc))


def explain(exc):
    """The SignInError for what Authlib, joserfc or requests raised during a sign-in."""
    if isinstance(exc, SignInError):
        return exc
    if isinstance(exc, (requests.RequestException, ValueError)) and not isinstance(
        exc, joserfc_errors.JoseError
    ):
        error = _provider_unreachable(exc)
    elif isinstance(exc, OAuthError):
        error = _oauth_error(exc)
    elif isinstance(exc, joserfc_errors.JoseError):
        error = _token_error(exc)
    elif isinstance(exc, (RuntimeError, KeyError)):
        # Authlib's own complaints about the provider's metadata (no jwks_uri, ...).
        error = SignInError(
            "The identity provider's configuration is incomplete",
            f"{exc} (from {discovery_url()}).",
        )
    else:
        raise exc
    error.cause = f"{type(exc).__name__}: {exc}"
    return error


def claims_of(token):
    """The validated id token's claims; when they lack the username or groups claim and the
    provider has a userinfo endpoint, the userinfo answer's claims fill in what is missing
    (providers that keep id tokens small send profile and groups claims there only)."""
    claims = token.get("userinfo")
    if not claims:
        raise SignInError(
            "The identity provider sent no id token",
            "Its token answer has no id_token: is the openid scope in OIDC_SCOPES, and is the "
            "client an OpenID Connect client at the provider?",
        )
    claims = dict(claims)
    wanted = (settings.OIDC_USERNAME_CLAIM, settings.OIDC_GROUPS_CLAIM)
    missing = [name for name in wanted if claim_at(claims, name) is None]
    if missing and client().load_server_metadata().get("userinfo_endpoint"):
        userinfo = dict(client().userinfo(token=token))
        if userinfo.get("sub") == claims.get("sub"):
            for name, value in userinfo.items():
                claims.setdefault(name, value)
            for name in missing:
                value = claim_at(userinfo, name)
                if value is not None:
                    claims[name] = value
    return claims


def claim_at(claims, path):
    """A claim by name, or by a dotted path into nested claims; None when absent."""
    if path in claims:
        return claims[path]
    value = claims
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def groups_of(claims):
    value = claim_at(claims, settings.OIDC_GROUPS_CLAIM)
    if value is None:
        return None
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return value
    raise SignInError(
        "The groups claim is not a list of names",
        f"The provider's {settings.OIDC_GROUPS_CLAIM!r} claim is {type(value).__name__}: "
        "Lazarus expects a list of group names (or one name).",
    )


def _username(claims):
    value = claim_at(claims, settings.OIDC_USERNAME_CLAIM)
    if not isinstance(value, str) or not value.strip():
        raise SignInError(
            "The id token does not name the user",
            f"It has no {settings.OIDC_USERNAME_CLAIM!r} claim (OIDC_USERNAME_CLAIM). Configure "
            "the provider to send it, or set OIDC_USERNAME_CLAIM to a claim it sends.",
        )
    value = value.strip()
    try:
        UnicodeUsernameValidator()(value)
        if len(value) > 150:
            raise ValidationError("longer than 150 characters")
    except ValidationError as invalid:
        raise SignInError(
            "The user name the provider sent is not usable",
            f"{value!r} ({settings.OIDC_USERNAME_CLAIM}): {' '.join(invalid.messages)}",
        ) from None
    return value


def sign_in(claims):
    """The Lazarus user these validated id token claims sign in as, with their mapped role and
    teams applied (recovery.access.provisioning); raises Refused (logged in the activity log)
    or SignInError (a claim Lazarus cannot use)."""
    account = provisioning.Account(
        issuer=claims["iss"],
        subject=str(claims["sub"]),
        username=_username(claims),
        groups=groups_of(claims),
        email=claims.get("email") or "",
        # Some providers (Amazon Cognito) send the boolean as a string.
        email_verified=claims.get("email_verified") in (True, "true"),
    )
    return provisioning.sign_in(account)
