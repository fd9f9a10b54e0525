"""Login throttling that cannot be turned against its users (docs/security.md "Logins").

django-axes counts failed logins and locks **a username at one address**
(LOGIN_FAILURE_LIMIT failures within LOGIN_LOCKOUT_MINUTES): one person mistyping, or an insider
guessing, behind the office NAT or the VPN egress locks that account there, not everyone there.
Two wider limits are read here from axes' own attempt records:

- **spraying**: an address with LOGIN_ADDRESS_FAILURE_LIMIT (100) failures across usernames
  (a scanner guessing many accounts from one host, or random usernames sent to lock an office
  out) is slowed, never locked: from it, a username that has failed there may be tried once
  per LOGIN_SLOWDOWN_SECONDS; a username that has not failed there (the office's other users,
  a break-glass superuser) goes straight to its password check. Everyone behind the address
  still gets in; a guesser gets one try per username every few seconds, and axes locks each
  username there at LOGIN_FAILURE_LIMIT as before;
- **a username attacked from several addresses** (LOGIN_FAILURE_LIMIT failures in all, from two
  addresses or more) is slowed, not locked: each address may try it once per
  LOGIN_SLOWDOWN_SECONDS. Its owner, at an address that has not failed, logs in at once; an
  attacker's addresses each get a guess every few seconds, and axes locks each of them at
  LOGIN_FAILURE_LIMIT.

The client address is the caller's: behind LOGIN_PROXY_COUNT reverse proxies it is taken from
X-Forwarded-For, counting that many hops from the right (each proxy appends the address it
received the request from, so entries further left are whatever the client sent and are not
trusted); with 0 proxies, REMOTE_ADDR only, whatever X-Forwarded-For says.
"""

import datetime

from axes.models import AccessAttempt
from django.conf import settings
from django.db.models import Count, Max, Sum
from django.utils import timezone


def client_address(request):
    """The caller's address (AXES_CLIENT_IP_CALLABLE): see the module docstring."""
    remote = request.META.get("REMOTE_ADDR", "")
    proxies = settings.LOGIN_PROXY_COUNT
    if not proxies:
        return remote
    hops = [h.strip() for h in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",")]
    hops = [h for h in hops if h]
    # Fewer hops than proxies: the request did not come through all of them (or a proxy is
    # misconfigured); the direct peer is the only address known to be true.
    return hops[-proxies] if len(hops) >= proxies else remote


def _recent():
    return AccessAttempt.objects.filter(
        attempt_time__gte=timezone.now() - settings.AXES_COOLOFF_TIME
    )


def address_failures(address):
    return _recent().filter(ip_address=address).aggregate(n=Sum("failures_since_start"))["n"] or 0


def username_pressure(username):
    """(failures in all, distinct addresses) for a username within the cool-off."""
    row = (
        _recent()
        .filter(username=username)
        .aggregate(n=Sum("failures_since_start"), addresses=Count("ip_address", distinct=True))
    )
    return row["n"] or 0, row["addresses"]


def _wait_left(username, address):
    """Seconds before ``username`` may be tried again from ``address`` (one try per
    LOGIN_SLOWDOWN_SECONDS after its last failure there), or None: now."""
    last = (
        _recent()
        .filter(username=username, ip_address=address)
        .aggregate(last=Max("attempt_time"))["last"]
    )
    wait = datetime.timedelta(seconds=settings.LOGIN_SLOWDOWN_SECONDS)
    if last is None or timezone.now() - last >= wait:
        return None
    return max(1, round((wait - (timezone.now() - last)).total_seconds()))


def refusal(username, address):
    """Why a login attempt is refused before its password is checked, or None.

    (django-axes refuses the locked username-at-address pairs itself, with 429.) Nothing here
    refuses a username that has not failed from the caller's address: no failures of other
    usernames, from there or anywhere, can lock its owner out."""
    if not username:
        return None
    wait = settings.LOGIN_SLOWDOWN_SECONDS
    if address and address_failures(address) >= settings.LOGIN_ADDRESS_FAILURE_LIMIT:
        left = _wait_left(username, address)
        if left is None:
            return None
        return (
            f"Too many failed logins from your address ({address}) for several accounts, so "
            f"each account that failed from it may be tried once every {wait} s: try again in "
            f"{left} s. An admin can lift this on the Users page."
        )
    failures, addresses = username_pressure(username)
    if failures < settings.AXES_FAILURE_LIMIT or addresses < 2:
        return None
    left = _wait_left(username, address)
    if left is None:
        return None
    return (
        f"This account has failed logins from several addresses, so each address may try it "
        f"once every {wait} s: try again in {left} s."
    )


def lockouts():
    """What is refused or slowed now, for the Users page: username-at-address locks (axes),
    addresses over the spraying limit (slowed), and usernames being slowed."""
    recent = _recent()
    limit = settings.AXES_FAILURE_LIMIT
    pairs = [
        {"username": a.username, "address": a.ip_address, "failures": a.failures_since_start}
        for a in recent.filter(failures_since_start__gte=limit).order_by("username", "ip_address")
    ]
    by_address = recent.values("ip_address").annotate(failures=Sum("failures_since_start"))
    addresses = [
        {"address": row["ip_address"], "failures": row["failures"]}
        for row in by_address.filter(failures__gte=settings.LOGIN_ADDRESS_FAILURE_LIMIT).order_by(
            "ip_address"
        )
    ]
    by_username = recent.values("username").annotate(
        failures=Sum("failures_since_start"), addresses=Count("ip_address", distinct=True)
    )
    slowed = [
        {"username": row["username"], "failures": row["failures"], "addresses": row["addresses"]}
        for row in by_username.filter(failures__gte=limit, addresses__gte=2).order_by("username")
    ]
    return {"pairs": pairs, "addresses": addresses, "slowed": slowed}
