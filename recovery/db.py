"""Direct psycopg connections to Lazarus's own database, beside Django's.

The collector's COPY path, the replay runner, the audit export and the outbox forwarder speak
psycopg directly (binary COPY, SKIP LOCKED claims, long-lived connections Django would not
keep); they all connect through here, each under its own ``application_name`` so
``pg_stat_activity`` says which part of Lazarus a backend serves.
"""

import psycopg
from django.db import connections


def database_conninfo(application_name="lazarus", alias="default"):
    """psycopg connection string for the Django database (the test database inside tests)."""
    cfg = connections[alias].settings_dict
    return psycopg.conninfo.make_conninfo(
        dbname=cfg["NAME"],
        user=cfg["USER"] or None,
        password=cfg["PASSWORD"] or None,
        host=cfg["HOST"] or None,
        port=cfg["PORT"] or None,
        application_name=application_name,
        connect_timeout=10,
        # A database host that vanishes without a RST must not hang a batch or a claim forever:
        # the first probe after 10 s idle, a dead peer is given up after 10 + 3 * 5 = 25 s.
        keepalives=1,
        keepalives_idle=10,
        keepalives_interval=5,
        keepalives_count=3,
    )
