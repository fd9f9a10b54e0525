"""Lazarus settings: everything an operator may change comes from the environment.

The helpers below fail loudly (ImproperlyConfigured) on a value they cannot parse, so a typo in a
deployment is an error at start-up, not a silent default at 3 a.m.
"""

import datetime
import ipaddress
import os
import warnings
from pathlib import Path
from urllib.parse import unquote, urlparse

from django.core.exceptions import ImproperlyConfigured

from recovery.alerts.outbound import parse_allow as parse_target_allow
from recovery.rates import parse_rate

BASE_DIR = Path(__file__).resolve().parent.parent


def env_str(name, default=None):
    value = os.environ.get(name)
    if value is None or value == "":
        if default is None:
            raise ImproperlyConfigured(f"environment variable {name} is required")
        return default
    return value


def env_bool(name, default):
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ImproperlyConfigured(f"{name}={value!r} is not a boolean (use true/false)")


def env_int(name, default, minimum=None):
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        number = int(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={value!r} is not an integer") from None
    if minimum is not None and number < minimum:
        raise ImproperlyConfigured(f"{name}={number} is below the minimum {minimum}")
    return number


def env_float(name, default):
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return float(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={value!r} is not a number") from None


def env_list(name, default):
    value = os.environ.get(name)
    if value is None:
        return list(default)
    return [item.strip() for item in value.split(",") if item.strip()]


def env_url(name, default, schemes):
    value = env_str(name, default)
    parsed = urlparse(value)
    if parsed.scheme not in schemes or not parsed.hostname:
        raise ImproperlyConfigured(
            f"{name}={value!r} is not a URL with scheme {' or '.join(schemes)} and a host"
        )
    return value


def database_from_url(url):
    parsed = urlparse(url)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parsed.path.lstrip("/")) or "lazarus",
        "USER": unquote(parsed.username or "postgres"),
        "PASSWORD": unquote(parsed.password or ""),
        "HOST": parsed.hostname or "127.0.0.1",
        "PORT": str(parsed.port or 5432),
        "CONN_MAX_AGE": 60,
        "CONN_HEALTH_CHECKS": True,
    }


DEVELOPMENT_SECRET_KEY = "lazarus-development-only-secret-key-change-me-in-production-0123456789"

DEBUG = env_bool("DEBUG", False)
SECRET_KEY = os.environ.get("SECRET_KEY") or ""
if not SECRET_KEY or SECRET_KEY == DEVELOPMENT_SECRET_KEY:
    # The development key is published: anyone could sign sessions, password-reset and SSO
    # state with it. Only a demo (DEBUG, as make run sets it) or the test suite (pytest sets
    # PYTEST_VERSION for itself and the processes it starts) may run on it; anything else,
    # a web, worker or release process, refuses to start (docs/production.md).
    if not DEBUG and "PYTEST_VERSION" not in os.environ:
        raise ImproperlyConfigured(
            "SECRET_KEY is not set (or is the published development key) and DEBUG is off: "
            "set SECRET_KEY to a long random value, e.g. "
            "python -c 'import secrets; print(secrets.token_urlsafe(50))'."
        )
    SECRET_KEY = DEVELOPMENT_SECRET_KEY
    warnings.warn(
        "SECRET_KEY is not set: using the development key (DEBUG or tests only).",
        RuntimeWarning,
        stacklevel=1,
    )
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

DATABASE_URL = env_url(
    "DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/lazarus", ("postgres", "postgresql")
)
DATABASES = {"default": database_from_url(DATABASE_URL)}
# DATABASE_URL goes through a pooler in transaction mode (PgBouncer): no session state may be
# relied on (docs/production.md "Behind PgBouncer"): server-side cursors off, psycopg's
# automatic prepared statements off, session SETs skipped, and the one session lock Lazarus
# takes (the search indexer's) taken on DATABASE_DIRECT_URL, a direct route to the same
# database (its host, port, user and password; the database name is DATABASE_URL's).
DATABASE_POOLED = env_bool("DATABASE_POOLED", False)
# Each statement a web request runs is cancelled past this (console/query_budget.py): the request
# answers 503 "narrow your filter". 0: unbounded.
REQUEST_STATEMENT_TIMEOUT_MS = env_int("REQUEST_STATEMENT_TIMEOUT_MS", 5000, minimum=0)
DATABASE_DIRECT_URL = os.environ.get("DATABASE_DIRECT_URL", "")
if DATABASE_DIRECT_URL:
    env_url("DATABASE_DIRECT_URL", None, ("postgres", "postgresql"))
if DATABASE_POOLED:
    DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True
    if not DATABASE_DIRECT_URL:
        raise ImproperlyConfigured(
            "DATABASE_POOLED=true needs DATABASE_DIRECT_URL (a direct route to the database for "
            "the search indexer's session lock; see docs/production.md)"
        )

# The broker Lazarus watches. Its vhost is the default vhost for the collector and replays.
RABBITMQ_URL = env_url("RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/%2F", ("amqp", "amqps"))
# The other nodes of its cluster ("host:port", comma-separated; credentials and vhost are
# RABBITMQ_URL's). Every AMQP connection Lazarus opens (collector, replay publisher, wire,
# Celery's) tries RABBITMQ_URL's node first, then these, and on a lost connection reconnects to
# the next one that answers (docs/production.md, "A RabbitMQ cluster").
RABBITMQ_NODES = env_list("RABBITMQ_NODES", [])
for _node in RABBITMQ_NODES:
    _host, _, _port = _node.rpartition(":")
    if not _host or not _port.isdigit():
        raise ImproperlyConfigured(f"RABBITMQ_NODES: {_node!r} is not host:port")
RABBITMQ_MANAGEMENT_URL = env_url(
    "RABBITMQ_MANAGEMENT_URL", "http://guest:guest@127.0.0.1:15672", ("http", "https")
)
# The broker's own counters (rabbitmq_prometheus, one URL per node of a cluster: they are per
# node), read by the tally that sets them against the store (recovery/broker/tally.py). Default:
# the management host on the plugin's port.
RABBITMQ_PROMETHEUS_URLS = env_list(
    "RABBITMQ_PROMETHEUS_URLS",
    [f"http://{urlparse(RABBITMQ_MANAGEMENT_URL).hostname}:15692/metrics"],
)
for _url in RABBITMQ_PROMETHEUS_URLS:
    if urlparse(_url).scheme not in ("http", "https"):
        raise ImproperlyConfigured(f"RABBITMQ_PROMETHEUS_URLS: {_url!r} is not an http(s) URL")
# How often beat samples the broker's counters against the store, and how long samples stay.
BROKER_TALLY_SECONDS = env_int("BROKER_TALLY_SECONDS", 60, minimum=5)
BROKER_TALLY_KEEP_DAYS = env_int("BROKER_TALLY_KEEP_DAYS", 14, minimum=1)
# The broker health page's management API reads are cached this long per process.
BROKER_HEALTH_CACHE_SECONDS = env_int("BROKER_HEALTH_CACHE_SECONDS", 10, minimum=0)

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "django_htmx",
    "template_partials",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "recovery",
    "console",
    "axes",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "console.query_budget.QueryBudgetMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "console.middleware.ContentSecurityPolicyMiddleware",
    "console.middleware.TeamScopeMiddleware",
    # Last, as django-axes asks: it answers a locked-out login attempt.
    "axes.middleware.AxesMiddleware",
]

# Login throttling (recovery/access/throttle.py, django-axes): LOGIN_FAILURE_LIMIT failed logins of
# one username from one client address lock that pair for LOGIN_LOCKOUT_MINUTES (or until an admin
# unlocks it on the users page); LOGIN_ADDRESS_FAILURE_LIMIT failures from one address across
# usernames slow that address (each username that failed there: one try per
# LOGIN_SLOWDOWN_SECONDS; a username that has not failed there is not held up); a username
# failing from several addresses is slowed to one attempt per LOGIN_SLOWDOWN_SECONDS per
# address, never locked. API tokens are not passwords and
# are not affected.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    # ModelBackend, refusing passwords of non-superusers under LOCAL_LOGIN=superusers.
    "console.auth_backends.LocalLoginBackend",
    # Sessions opened by a provider sign-in (no password).
    "console.auth_backends.SsoBackend",
]
AXES_FAILURE_LIMIT = env_int("LOGIN_FAILURE_LIMIT", 10, minimum=1)
AXES_COOLOFF_TIME = datetime.timedelta(minutes=env_int("LOGIN_LOCKOUT_MINUTES", 30, minimum=1))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_VERBOSE = False
LOGIN_ADDRESS_FAILURE_LIMIT = env_int("LOGIN_ADDRESS_FAILURE_LIMIT", 100, minimum=1)
LOGIN_SLOWDOWN_SECONDS = env_int("LOGIN_SLOWDOWN_SECONDS", 5, minimum=1)
# Reverse proxies in front of Lazarus: the client address is then the one this many hops from the
# right of X-Forwarded-For (each proxy appends the address it got the request from); 0 trusts
# REMOTE_ADDR only. Wrong either way, and all callers share one address (too many proxies
# counted: a forged one; too few: the proxy's).
LOGIN_PROXY_COUNT = env_int("LOGIN_PROXY_COUNT", 0, minimum=0)
AXES_CLIENT_IP_CALLABLE = "recovery.access.throttle.client_address"

# Single sign-on through an OpenID Connect provider (console/sso.py; docs/security.md "Single
# sign-on"): off while OIDC_ISSUER is empty. The provider's endpoints are discovered from
# <issuer>/.well-known/openid-configuration; every request to it gives up after
# OIDC_TIMEOUT_SECONDS. Which groups give which role and team is configured in the console
# (/sso/mappings/).
OIDC_ISSUER = os.environ.get("OIDC_ISSUER", "")
if OIDC_ISSUER:
    env_url("OIDC_ISSUER", None, ("http", "https"))
    OIDC_CLIENT_ID = env_str("OIDC_CLIENT_ID")
    OIDC_CLIENT_SECRET = env_str("OIDC_CLIENT_SECRET")
else:
    OIDC_CLIENT_ID = os.environ.get("OIDC_CLIENT_ID", "")
    OIDC_CLIENT_SECRET = os.environ.get("OIDC_CLIENT_SECRET", "")
OIDC_SCOPES = env_str("OIDC_SCOPES", "openid email profile").replace(",", " ").split()
if "openid" not in OIDC_SCOPES:
    raise ImproperlyConfigured(f"OIDC_SCOPES={' '.join(OIDC_SCOPES)!r} must include openid")
# The claims that name the user (their Lazarus username, taken at their first sign-in) and hold
# their groups (a list of strings, or one string; a dotted path reads a nested claim, such as
# Keycloak's realm_access.roles).
OIDC_USERNAME_CLAIM = env_str("OIDC_USERNAME_CLAIM", "preferred_username")
OIDC_GROUPS_CLAIM = env_str("OIDC_GROUPS_CLAIM", "groups")
OIDC_PROVIDER_NAME = env_str("OIDC_PROVIDER_NAME", "single sign-on")
OIDC_TIMEOUT_SECONDS = env_float("OIDC_TIMEOUT_SECONDS", 10.0)
if OIDC_TIMEOUT_SECONDS <= 0:
    raise ImproperlyConfigured("OIDC_TIMEOUT_SECONDS must be above 0")
# How far the provider's clock may be from this server's when an id token's iat/exp are checked.
OIDC_CLOCK_LEEWAY_SECONDS = env_int("OIDC_CLOCK_LEEWAY_SECONDS", 60, minimum=0)
# Who may log in with a password: all users, or superusers only (break-glass), everyone else
# through the provider.
LOCAL_LOGIN = env_str("LOCAL_LOGIN", "all")
if LOCAL_LOGIN not in ("all", "superusers"):
    raise ImproperlyConfigured(f"LOCAL_LOGIN={LOCAL_LOGIN!r} is not all or superusers")

ROOT_URLCONF = "console.urls"
WSGI_APPLICATION = "console.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "console.context_processors.roles",
            ],
        },
    },
]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = BASE_DIR / "var" / "staticfiles"
# With DEBUG, WhiteNoise also serves files collectstatic has not copied yet (make run uses
# `runserver --nostatic`, so static files always pass the security middleware: nosniff).
WHITENOISE_USE_FINDERS = DEBUG
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "overview"
LOGOUT_REDIRECT_URL = "login"

SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", not DEBUG)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", not DEBUG)
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", False)
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0, minimum=0)
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"
# Production behind HTTPS: SECURE_SSL_REDIRECT=true, SECURE_HSTS_SECONDS=31536000 and, once every
# subdomain is HTTPS too, SECURE_HSTS_INCLUDE_SUBDOMAINS / SECURE_HSTS_PRELOAD (`manage.py check
# --deploy` then reports nothing). Behind a TLS-terminating proxy also TRUST_X_FORWARDED_PROTO=true,
# or the redirect loops.
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", False)
if env_bool("TRUST_X_FORWARDED_PROTO", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_REFERRER_POLICY = "same-origin"
SESSION_COOKIE_HTTPONLY = True

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "recovery.api.auth.HashedTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["recovery.api.permissions.RolePermission"],
    "DEFAULT_SCHEMA_CLASS": "recovery.api.schema.LazarusAutoSchema",
    "DEFAULT_PAGINATION_CLASS": "recovery.api.pagination.NewestFirstCursorPagination",
    "PAGE_SIZE": 50,
    # JSON in, JSON out: one media type the schema describes exactly (no browsable/form variants).
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["recovery.api.parsers.JSONParser"],
    "DEFAULT_THROTTLE_CLASSES": ["recovery.api.throttling.TokenRateThrottle"],
    # Every error is application/problem+json (recovery/api/errors.py).
    "EXCEPTION_HANDLER": "recovery.api.errors.exception_handler",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Lazarus API",
    "DESCRIPTION": "Browse, replay and audit messages RabbitMQ gave up on.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    # Several models have a "status"; name each choice set once.
    "ENUM_NAME_OVERRIDES": {
        "MessageStatusEnum": "recovery.models.Status",
        "MessageKindEnum": "recovery.models.Kind",
        "MessageStateEnum": "recovery.api.serializers.MESSAGE_STATES",
        "AuditRunStatusEnum": "recovery.api.audits.AuditRunState",
        "FinalityEnum": "recovery.api.audits.FINALITY",
        "AuditOutcomeEnum": "recovery.api.audits.AUDIT_OUTCOMES",
        "AlertKindEnum": "recovery.api.alerts.serializers.AlertKind",
        "AlertRuleStateEnum": "recovery.api.alerts.serializers.AlertRuleState",
        "AlertKnownStateEnum": "recovery.api.alerts.serializers.ALERT_KNOWN_STATES",
        "ChannelKindEnum": "recovery.api.alerts.serializers.ChannelKind",
        "UncoveredKindEnum": "recovery.api.uncovered.UNCOVERED_KINDS",
        "ReplayJobStateEnum": "recovery.api.replay_jobs.ReplayJobState",
        # A membership's role and a sign-in mapping's team_role; a mapping's global role.
        "TeamRoleEnum": "recovery.access.teams.Membership.TeamRole",
        "GlobalRoleEnum": "recovery.access.models.Role",
    },
}


def env_rate(name, default):
    """A rate like ``600/min`` (periods s, min, hour, day; recovery.rates, as the API reads it)."""
    value = env_str(name, default)
    try:
        parse_rate(value)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={value!r} is not a rate like 600/min") from None
    return value


# Requests per API token (per user for browser sessions), counted in PostgreSQL so every web
# process shares the limit; over it the API answers 429 with Retry-After.
API_RATE_LIMIT = env_rate("API_RATE_LIMIT", "600/min")
# How long an Idempotency-Key and the response stored for it are kept.
IDEMPOTENCY_TTL_HOURS = env_int("IDEMPOTENCY_TTL_HOURS", 24, minimum=1)

# --- Recovery topology (docs/design.md "Broker topology"); every name is configurable. ---
RECOVERY_DLX = env_str("RECOVERY_DLX", "recovery.dlx")
RECOVERY_DEAD_LETTER_QUEUE = env_str("RECOVERY_DEAD_LETTER_QUEUE", "recovery.dead_letters")
RECOVERY_UNROUTED = env_str("RECOVERY_UNROUTED", "recovery.unrouted")
RECOVERY_RETURNS_QUEUE = env_str("RECOVERY_RETURNS_QUEUE", "recovery.returns")
RECOVERY_QUARANTINE_QUEUE = env_str("RECOVERY_QUARANTINE_QUEUE", "recovery.quarantine")
# Where the recovery source queues dead-letter what passes a delivery limit (an exchange and a
# classic queue of this name; the collector drains it too). docs/decisions.md.
RECOVERY_PARKED = env_str("RECOVERY_PARKED", "recovery.parked")
# The vhosts the collector serves; each needs `manage.py wire --vhost V`. Default: the vhost of
# RABBITMQ_URL.
RECOVERY_VHOSTS = env_list("RECOVERY_VHOSTS", [unquote(urlparse(RABBITMQ_URL).path[1:] or "/")])

# Collector tunables (measured in bench/collector.py).
COLLECTOR_ENABLED = env_bool("COLLECTOR_ENABLED", True)
# Prefetch 2000 / batch 500, measured on 30k 1 KiB dead letters (msgs/s, best of two, 2 cores):
# prefetch 100/batch 100: 1380; 500/500: 1676; 2000/100: 2369; 2000/500: 2661; 2000/2000: 2708
# but 1827 in the other run (batch = prefetch leaves one batch in flight: no pipelining);
# 5000/500: 2592. Below ~2000 the drain waits for acks; above it only memory grows and a crash
# redelivers more (a crash redelivers up to the prefetch). Small batches pay a commit each.
COLLECTOR_PREFETCH = env_int("COLLECTOR_PREFETCH", 2000, minimum=1)
COLLECTOR_BATCH_SIZE = env_int("COLLECTOR_BATCH_SIZE", 500, minimum=1)
COLLECTOR_FLUSH_SECONDS = env_float("COLLECTOR_FLUSH_SECONDS", 0.2)
COLLECTOR_MAX_BODY_BYTES = env_int("COLLECTOR_MAX_BODY_BYTES", 64 * 1024 * 1024, minimum=1)
# How far one byte layer of a body (gzip, deflate, zstd) may inflate when the console, the API or
# the search index decodes it (recovery.bodies): past it the decoded form is cut and labelled.
BODY_DECODE_LIMIT = env_int("BODY_DECODE_LIMIT", 16 * 1024 * 1024, minimum=1024)
# Private data (docs/security.md, "Private data"): how long a break-glass unmask lasts, how long
# one masking regular expression may run on one piece of content before it is withheld whole,
# how many recent messages a masking rule is tried on to say whether it matches anything, and
# the most messages one export may hold.
UNMASK_SECONDS = env_int("UNMASK_SECONDS", 15 * 60, minimum=1)
MASK_REGEX_TIMEOUT_MS = env_int("MASK_REGEX_TIMEOUT_MS", 100, minimum=1)
MASK_RULE_SAMPLE = env_int("MASK_RULE_SAMPLE", 200, minimum=1)
EXPORT_MAX_MESSAGES = env_int("EXPORT_MAX_MESSAGES", 100_000, minimum=1)
# Seconds to wait for a schema registry (a decoder rule's Avro schemas by id) before the body
# is shown raw with the reason.
SCHEMA_REGISTRY_TIMEOUT = env_float("SCHEMA_REGISTRY_TIMEOUT", 3.0)
# Bytes the prefetch window may hold per source: RabbitMQ's prefetch counts messages, so the
# collector derives the count from this and the body sizes it sees
# (recovery.collector.consumer.Window).
COLLECTOR_PREFETCH_BYTES = env_int("COLLECTOR_PREFETCH_BYTES", 64 * 1024 * 1024, minimum=1)
# Database writers per collector process, shared by all its sources and vhosts. Most of a
# batch's time is PostgreSQL maintaining the store's indexes, in its own process: a second writer
# lets that run on a second core while the first commits (2475 vs 1664 msg/s, 2 cores). More
# writers than the database has cores only add churn; each is one database connection.
COLLECTOR_WRITERS = env_int("COLLECTOR_WRITERS", 2, minimum=1)
# Collector processes per worker started with --collector (recovery/collector_processes.py): the
# worker's own plus this many minus one. One Python process decodes on one core at most; 0 means
# one per CPU core the worker may use.
COLLECTOR_PROCESSES = env_int("COLLECTOR_PROCESSES", 0, minimum=0)

# Replay.
# How often the search indexer copies new messages into the trigram-indexed search table.
SEARCH_INDEX_SECONDS = env_float("SEARCH_INDEX_SECONDS", 2.0)
# While at least this many messages wait in the recovery queues (a flood being dead-lettered),
# the indexer waits: on a small machine its trigram-index writes take the cores the collector
# needs (bench/collector.py --race --as-run, 30k: race ratio 0.72 with the indexer running, 0.78
# without). Storing comes first; searches read the unindexed tail directly meanwhile. It waits
# at most SEARCH_INDEX_MAX_DEFER_SECONDS (the oldest unindexed message's age), then indexes
# anyway. 0: never waits.
SEARCH_INDEX_DEFER_BACKLOG = env_int("SEARCH_INDEX_DEFER_BACKLOG", 1000, minimum=0)
SEARCH_INDEX_MAX_DEFER_SECONDS = env_float("SEARCH_INDEX_MAX_DEFER_SECONDS", 60.0)
REPLAY_CONFIRM_TIMEOUT_SECONDS = env_float("REPLAY_CONFIRM_TIMEOUT_SECONDS", 30.0)
POISON_THRESHOLD = env_int("POISON_THRESHOLD", 3, minimum=1)
RETENTION_DAYS = env_int("RETENTION_DAYS", 30, minimum=1)
# Retention is housekeeping: it works at most this share of its run's time and pauses the rest,
# so the collector and the pages keep the machine (recovery.retention.run; at 10M stored,
# deleting at full speed left a collector draining a flood 0.55 of its rate: docs/big-store.md).
RETENTION_DUTY = env_float("RETENTION_DUTY", 0.25)
if not 0 < RETENTION_DUTY <= 1:
    raise ImproperlyConfigured(f"RETENTION_DUTY={RETENTION_DUTY} is not in (0, 1]")
# A run stops after this long and the next hourly run goes on, so runs never pile up.
RETENTION_BUDGET_SECONDS = env_int("RETENTION_BUDGET_SECONDS", 45 * 60, minimum=1)
# What was done to each message (recovery.models.history) outlives the message: kept this long.
HISTORY_DAYS = env_int("HISTORY_DAYS", 400, minimum=1)
# Where retention writes what it deletes first (gzip JSON Lines, one file per vhost and day:
# recovery.retention.archive); empty: it deletes without an archive.
RETENTION_ARCHIVE_DIR = os.environ.get("RETENTION_ARCHIVE_DIR", "")
# Bulk replay engine (recovery/replay/, bench/replay.py).
# Publishes awaiting their confirm at once per job, which is also the most messages a crash or a
# force-closed connection can duplicate (they are resent). Bigger = faster on a slow link.
REPLAY_WINDOW = env_int("REPLAY_WINDOW", 1000, minimum=1)
# Messages claimed from the database per round trip.
REPLAY_CLAIM_BATCH = env_int("REPLAY_CLAIM_BATCH", 500, minimum=1)
# A job whose runner has not renewed its lease for this long is taken over by another worker
# (after a crash or kill -9); `recovery.replay.tasks.resume_stalled_jobs` looks every SWEEP seconds.
REPLAY_LEASE_SECONDS = env_float("REPLAY_LEASE_SECONDS", 30.0)
REPLAY_STALL_SWEEP_SECONDS = env_float("REPLAY_STALL_SWEEP_SECONDS", 15.0)


def env_seconds_list(name, default):
    values = env_list(name, [str(v) for v in default])
    if not values or not all(v.isdigit() and int(v) > 0 for v in values):
        raise ImproperlyConfigured(f"{name} must list positive whole seconds, like 10,60,600")
    return sorted({int(v) for v in values})


# Delayed retries: the allowed delays (seconds) and the name prefix of their TTL + DLX queues
# (recovery.delay.10s, recovery.delay.1m, ...), declared on first use.
REPLAY_DELAYS = env_seconds_list("REPLAY_DELAYS", [10, 60, 600])
REPLAY_DELAY_PREFIX = env_str("REPLAY_DELAY_PREFIX", "recovery.delay")
# Job safety defaults (a job may set its own): canary pass mark and circuit-breaker threshold
# in % of replayed messages that come back dead-lettered; 0 turns the breaker off by default.
REPLAY_CANARY_MAX_FAILURE_PCT = env_float("REPLAY_CANARY_MAX_FAILURE_PCT", 10.0)
REPLAY_BREAKER_THRESHOLD_PCT = env_float("REPLAY_BREAKER_THRESHOLD_PCT", 50.0)
# The breaker judges only after this many replayed messages (a few early deaths are noise).
REPLAY_BREAKER_MIN_SAMPLE = env_int("REPLAY_BREAKER_MIN_SAMPLE", 20, minimum=1)

# Audit (spark/).
AUDIT_PRODUCER_LOGS = env_str("AUDIT_PRODUCER_LOGS", str(BASE_DIR / "var" / "logs" / "producer"))
AUDIT_CONSUMER_LOGS = env_str("AUDIT_CONSUMER_LOGS", str(BASE_DIR / "var" / "logs" / "consumer"))
# OpenTelemetry spans (#47, recovery/telemetry/): where the span intake writes the messaging spans
# (Parquet, dt=YYYY-MM-DD/hour=HH/; a local path, s3a:// or hdfs://) and the audit reads them.
AUDIT_SPANS = env_str("AUDIT_SPANS", str(BASE_DIR / "var" / "spans"))
# The intake (POST /v1/traces, recovery/api/traces.py): a body's limit as sent and inflated, the
# batches one process writes at once, the free disk below which it refuses (503), and the
# Retry-After it sends with a 503.
OTLP_MAX_BODY_BYTES = env_int("OTLP_MAX_BODY_BYTES", 16 * 1024**2, minimum=1)
OTLP_MAX_INFLATED_BYTES = env_int("OTLP_MAX_INFLATED_BYTES", 64 * 1024**2, minimum=1)
OTLP_MAX_IN_FLIGHT = env_int("OTLP_MAX_IN_FLIGHT", 4, minimum=1)
OTLP_MIN_FREE_BYTES = env_int("OTLP_MIN_FREE_BYTES", 512 * 1024**2, minimum=0)
OTLP_RETRY_AFTER_SECONDS = env_int("OTLP_RETRY_AFTER_SECONDS", 5, minimum=1)
# The broker as a witness (#48, recovery/broker/trace.py): where the firehose tap writes its
# publish/deliver and coverage records (Parquet, dt=YYYY-MM-DD/hour=HH/), the trace queue's name,
# type ("auto": a stream on RabbitMQ 4.0+, a quorum queue before: 3.10 routes no firehose
# message into a stream) and a stream's retention.
AUDIT_TRACE = env_str("AUDIT_TRACE", str(BASE_DIR / "var" / "trace"))
RECOVERY_TRACE_QUEUE = env_str("RECOVERY_TRACE_QUEUE", "recovery.trace")
TRACE_QUEUE_TYPE = env_str("TRACE_QUEUE_TYPE", "auto")
TRACE_MAX_AGE = env_str("TRACE_MAX_AGE", "7D")
TRACE_MAX_LENGTH_BYTES = env_int("TRACE_MAX_LENGTH_BYTES", 20 * 1024**3, minimum=1)
TRACE_FLUSH_SECONDS = env_float("TRACE_FLUSH_SECONDS", 5.0)
TRACE_BATCH = env_int("TRACE_BATCH", 5000, minimum=1)
TRACE_TAP_ENABLED = env_bool("TRACE_TAP_ENABLED", False)
SPARK_MASTER = env_str("SPARK_MASTER", "local[*]")
# Where each audit puts its store export, bindings and the job's outputs (empty: the system's
# temporary directory). With SPARK_MASTER a cluster on other machines, it must be storage the
# executors and the machine running the audit share: the run fails, naming it, otherwise.
AUDIT_WORK_DIR = os.environ.get("AUDIT_WORK_DIR", "")
SPARK_DRIVER_MEMORY = env_str("SPARK_DRIVER_MEMORY", "2g")
# On a cluster the executors hold the day, not the driver (README "Scaling out": ~0.5 GB per
# million records of the day across executors). Empty: Spark's own default (1g).
SPARK_EXECUTOR_MEMORY = env_str("SPARK_EXECUTOR_MEMORY", "")
# Spark's default of 200 shuffle partitions is for clusters; a nightly slice on local[*] wants few.
SPARK_SHUFFLE_PARTITIONS = env_int("SPARK_SHUFFLE_PARTITIONS", 8, minimum=1)
AUDIT_TIMEOUT_SECONDS = env_int("AUDIT_TIMEOUT_SECONDS", 3 * 3600, minimum=1)
# Which consumer groups expect which exchange/routing key: a JSON file (it replaces the broker),
# or (empty) the bindings history beat records from the management API (one queue = one group).
AUDIT_BINDINGS = os.environ.get("AUDIT_BINDINGS", "")
# How often beat polls the bindings history: a binding created or removed between two polls is
# known to within this; a pause of three intervals is a gap the audit reports.
AUDIT_BINDINGS_POLL_SECONDS = env_int("AUDIT_BINDINGS_POLL_SECONDS", 60, minimum=5)
AUDIT_GRACE_MINUTES = env_int("AUDIT_GRACE_MINUTES", 60, minimum=0)
AUDIT_SLA_MS = env_int("AUDIT_SLA_MS", 5000, minimum=1)
# The nightly audit of yesterday (UTC) runs at this time (Celery beat).
AUDIT_NIGHTLY_AT = env_str("AUDIT_NIGHTLY_AT", "02:30")

# Alerts (recovery/alerts/): how often beat evaluates the rules and drains the notification
# outbox, how often a notification is tried before it is given up, and the console's address
# for the links in notifications.
ALERTS_EVALUATE_SECONDS = env_int("ALERTS_EVALUATE_SECONDS", 30, minimum=5)
ALERTS_DELIVER_SECONDS = env_int("ALERTS_DELIVER_SECONDS", 10, minimum=1)
ALERTS_MAX_ATTEMPTS = env_int("ALERTS_MAX_ATTEMPTS", 12, minimum=1)
# One send (connect, request, status and headers) must end within this wall-clock deadline,
# however slowly the receiver answers. ALERTS_HTTP_TIMEOUT_SECONDS is its former name.
ALERTS_SEND_DEADLINE_SECONDS = env_int(
    "ALERTS_SEND_DEADLINE_SECONDS",
    env_int("ALERTS_HTTP_TIMEOUT_SECONDS", 10, minimum=1),
    minimum=1,
)
# Webhook and Slack targets allowed (host names, host:port, addresses or CIDR networks; empty:
# any). Checked when sending, against the addresses the target resolves to (docs/alerts.md).
ALERTS_TARGET_ALLOW = env_list("ALERTS_TARGET_ALLOW", [])
try:
    parse_target_allow(ALERTS_TARGET_ALLOW)
except ValueError as _error:
    raise ImproperlyConfigured(f"ALERTS_TARGET_ALLOW: {_error}") from None
# Delivery runs on a queue of its own with its own worker (Procfile `alerts`, scripts/run.sh),
# so receivers that stall hold only delivery, never rule evaluation or the indexer.
ALERTS_TASK_QUEUE = env_str("ALERTS_TASK_QUEUE", "lazarus.alerts")
CONSOLE_BASE_URL = env_str("CONSOLE_BASE_URL", "http://127.0.0.1:8000")
# /metrics: client addresses or networks that may scrape without a token (empty: token or login
# only), and how many queues get series of their own (the rest are summed as __other__).
METRICS_ALLOWED_IPS = env_list("METRICS_ALLOWED_IPS", [])
for _network in METRICS_ALLOWED_IPS:
    try:
        ipaddress.ip_network(_network, strict=False)
    except ValueError:
        raise ImproperlyConfigured(
            f"METRICS_ALLOWED_IPS: {_network!r} is not an address or network"
        ) from None
METRICS_MAX_QUEUES = env_int("METRICS_MAX_QUEUES", 50, minimum=1)
# A secret a monitoring system sends as "Authorization: Token <it>": /metrics in full and the
# details of /healthz and /readyz, nothing else (no user, no page, no API). Empty: none.
MONITORING_TOKEN = os.environ.get("MONITORING_TOKEN", "")
if MONITORING_TOKEN and len(MONITORING_TOKEN) < 32:
    raise ImproperlyConfigured("MONITORING_TOKEN: at least 32 characters (a random secret)")
# Email notifications go through Django's SMTP backend with these.
EMAIL_HOST = env_str("EMAIL_HOST", "localhost")
EMAIL_PORT = env_int("EMAIL_PORT", 25, minimum=1)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = env_str("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)
EMAIL_TIMEOUT = 10
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "lazarus@localhost")

# Celery task traffic uses the same RabbitMQ unless CELERY_BROKER_URL says otherwise.
# With RABBITMQ_NODES, kombu's failover list (";"-separated): Celery reconnects to the next node.
_rabbit = urlparse(RABBITMQ_URL)
CELERY_BROKER_URL = env_str(
    "CELERY_BROKER_URL",
    ";".join(
        [RABBITMQ_URL]
        + [
            _rabbit._replace(netloc=_rabbit.netloc.rpartition("@")[0] + "@" + node).geturl()
            for node in RABBITMQ_NODES
        ]
    ),
)
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_DEFAULT_QUEUE = env_str("CELERY_TASK_DEFAULT_QUEUE", "lazarus.tasks")
# Replay jobs' tasks go to a queue of their own, consumed by workers started for it
# (`celery -A console worker --no-collector -Q lazarus.replay`; scripts/run.sh starts one), so a
# long job never holds the slot the search indexer, the counts or the outbox need. Empty: the
# default queue (one pool for everything, as before).
REPLAY_TASK_QUEUE = env_str("REPLAY_TASK_QUEUE", "lazarus.replay")
# The outbox's delivery, under its name and the one it had before #27 (a beat not yet restarted
# sends that one), goes to ALERTS_TASK_QUEUE.
CELERY_TASK_ROUTES = {
    name: {"queue": ALERTS_TASK_QUEUE}
    for name in (
        "recovery.alerts.tasks.deliver_notifications",
        "recovery.alert_tasks.deliver_notifications",
    )
}
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True

# Error pages (DEBUG or not) and error mails mask passwords inside URL settings as well.
DEFAULT_EXCEPTION_REPORTER_FILTER = "console.redaction.CredentialFilter"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    # Passwords inside URLs (RABBITMQ_URL, DATABASE_URL, ...) are masked in every log line.
    "filters": {"mask_credentials": {"()": "console.redaction.MaskCredentials"}},
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "plain",
            "filters": ["mask_credentials"],
        }
    },
    "loggers": {
        "recovery": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
        "console": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
        "pika": {"handlers": ["console"], "level": "WARNING"},
        # Django's own (django.request logs every 500 with its traceback) through the same
        # masking handler instead of Django's default one.
        "django": {"handlers": ["console"], "level": "INFO"},
    },
}
