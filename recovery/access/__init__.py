"""Who someone is and what they may touch: the one home of access (healthchecks' hc/accounts).

- models: roles, privileges, API tokens (only a key's SHA-256 is stored), the activity log
  (``Activity.record``, the one way to write a row)
- teams: teams, their scopes (vhost + globs) and memberships; an admin's removals
- scope: ``Scope`` (what one caller may see and change) and ``scope_of(request)``
- sso: single sign-on's group mappings and provider identities, and what a list of groups grants
- provisioning: who gets which role and membership at an SSO sign-in (the OpenID Connect
  protocol itself is the console's: console/sso.py)
- tokens: the API token a request carries, the caller's scope from it, the monitoring token
- throttle: the login throttle's rules over django-axes' attempt records

Floors (tests/test_layers.py): models, teams, scope and sso are at the models floor; they import
nothing of ``recovery.models``, which imports them so Django (and migrations) see the models
under ``app_label = "recovery"`` as before, and re-exports them. provisioning, tokens and throttle
read requests or act at sign-in: the domain floor, as recovery.masking.policy.

No request state in models: ``Activity.record(..., team=scope.acting_team)`` is told the team
an API token acts as by its caller; nothing is read from a context variable.

Thin glue stays where its framework is: console/access.py (the role decorators),
console/middleware.py (team callers fail closed), recovery/api/auth.py (DRF's authentication
class over ``ApiToken.authenticate``) and recovery/api/permissions.py (DRF's permission class
over ``Scope``). They are a few lines each over this package, and moving them here would make
this package import DRF and the console's views.
"""
