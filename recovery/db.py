"""Direct psycopg connections to Lazarus's own database, beside Django's.

The collector's COPY path, the replay runner, the audit export and the outbox forwarder speak
psycopg directly (binary COPY, SKIP LOCKED claims, long-lived connections Django would not
keep); they all connect through here, each under its own ``application_name`` so
``pg_stat_activity`` says which part of Lazarus a backend serves.

Behind a pooler in transaction mode (``DATABASE_POOLED``) a connection's statements may each
run on another server connection: ``connect`` then turns psycopg's automatic prepared
statements off, and code that needs a session (an advisory lock held across transactions)
connects with ``direct_conninfo`` instead.
"""

from urllib.parse import unquote, urlparse

import psycopg
from django.conf import settings
from django.db import connections


def database_conninfo(application_name="lazarus", alias="default", direct=False):
    """psycopg connection string for the Django database (the test database inside tests);
    ``direct``: through DATABASE_DIRECT_URL's host, port and credentials when it is set."""
    cfg = connections[alias].settings_dict
    route = {
        "user": cfg["USER"] or None,
        "password": cfg["PASSWORD"] or None,
        "host": cfg["HOST"] or None,
        "port": cfg["PORT"] or None,
    }
    if direct and settings.DATABASE_DIRECT_URL:
        url = urlparse(settings.DATABASE_DIRECT_URL)
        route = {
            "user": unquote(url.username or "postgres"),
            "password": unquote(url.password or "") or None,
            "host": url.hostname,
            "port": str(url.port or 5432),
        }
    return psycopg.conninfo.make_conninfo(
        dbname=cfg["NAME"],
        **route,
        application_name=application_name,
        connect_timeout=10,
        # A database host that vanishes without a RST must not hang a batch or a claim forever:
        # the first probe after 10 s idle, a dead peer is given up after 10 + 3 * 5 = 25 s.
        keepalives=1,
        keepalives_idle=10,
        keepalives_interval=5,
        keepalives_count=3,
    )


def direct_conninfo(application_name="lazarus"):
    return database_conninfo(application_name, direct=True)


def connect(conninfo, **kwargs):
    """``psycopg.connect`` as Lazarus's own connections need it: no automatic prepared
    statements behind a transaction-mode pooler (a statement prepared on one server connection
    does not exist on the next)."""
    if settings.DATABASE_POOLED:
        kwargs.setdefault("prepare_threshold", None)
    return psycopg.connect(conninfo, **kwargs)


def session_state_allowed():
    """Whether a connection's session settings (``SET ...``) stay with it: not behind a
    transaction-mode pooler, where they would land on a server connection other clients share."""
    return not settings.DATABASE_POOLED
