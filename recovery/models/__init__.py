"""The recovery app's models, split where the domain splits; import them from here.

- store: the recovery store (Message, its search documents, collector heartbeats)
- counts: the store's counts per hour and per failure group (the pages' queries over them:
  recovery.search.overview, recovery.search.details)
- recovery.access (its own package, registered here): roles, privileges, API tokens, the
  activity log; teams, their scopes and memberships; Scope; single sign-on's mappings and
  identities
- api: the API's idempotency keys and per-token rate windows
- replay: replay attempts, bulk jobs and their items, edited versions
- history: what was done to each message, kept after retention deleted it (HISTORY_DAYS)
- audit: nightly audit runs, windows, evidence, input gaps; the bindings history
- alerts: alert rules, their transitions, notification channels and the notification outbox
- broker: the broker's own tally of dead-lettered and dropped messages against the store, and
  the queries over its samples
- decoders: admins' rules for reading bodies (protobuf, Avro, MessagePack) per queue
- masking: masking rules for private data, and break-glass unmasks
- tasks: the store's Celery beat task folding the counts (retention, a process over the store:
  recovery.retention)
"""

from recovery.access.models import (
    ROLE_ORDER,
    Activity,
    ApiToken,
    Privilege,
    Role,
    global_privileges_of,
    global_role_of,
    hash_token,
    set_privileges,
    set_role,
)
from recovery.access.scope import Scope, scope_of, team_scoped
from recovery.access.sso import Grant, GroupMapping, SsoIdentity, log_refusal
from recovery.access.teams import (
    Membership,
    MembershipRemoval,
    Team,
    TeamScope,
    glob_to_regex,
    has_role,
    role_of,
)
from recovery.models.alerts import AlertRule, AlertTransition, Notification, NotificationChannel
from recovery.models.api import ApiRateWindow, IdempotencyKey
from recovery.models.audit import (
    WARNING_METRICS,
    AuditEvidence,
    AuditInputGap,
    AuditRun,
    AuditWindow,
    BindingPeriod,
    BindingsCoverage,
    metric_warnings,
)
from recovery.models.broker import BrokerTally
from recovery.models.counts import (
    COUNT_KEY_SQL,
    REBUILD_COUNTS_SQL,
    MessageCount,
    MessageTotal,
)
from recovery.models.decoders import DecoderRule
from recovery.models.history import HistoryAction, MessageHistory
from recovery.models.masking import MaskRule, Unmask
from recovery.models.replay import (
    MessageEdit,
    ReplayAttempt,
    ReplayJob,
    ReplayJobItem,
    mark_died_again,
)
from recovery.models.store import (
    DIED_AGAIN,
    DISCARDABLE,
    OPEN,
    REPLAYABLE,
    RESTORABLE,
    CollectorHeartbeat,
    Kind,
    Message,
    MessageSearch,
    Reason,
    Status,
    attach_died_again,
    default_target_of,
)

__all__ = [
    "GroupMapping",
    "Grant",
    "SsoIdentity",
    "log_refusal",
    "BrokerTally",
    "DecoderRule",
    "MaskRule",
    "Unmask",
    "Privilege",
    "global_privileges_of",
    "set_privileges",
    "COUNT_KEY_SQL",
    "DIED_AGAIN",
    "DISCARDABLE",
    "OPEN",
    "REBUILD_COUNTS_SQL",
    "REPLAYABLE",
    "RESTORABLE",
    "ROLE_ORDER",
    "Activity",
    "AlertRule",
    "AlertTransition",
    "Notification",
    "NotificationChannel",
    "ApiRateWindow",
    "ApiToken",
    "AuditEvidence",
    "AuditInputGap",
    "AuditRun",
    "AuditWindow",
    "BindingPeriod",
    "BindingsCoverage",
    "WARNING_METRICS",
    "metric_warnings",
    "CollectorHeartbeat",
    "HistoryAction",
    "IdempotencyKey",
    "Kind",
    "Message",
    "MessageCount",
    "MessageTotal",
    "MessageEdit",
    "MessageHistory",
    "MessageSearch",
    "Reason",
    "ReplayAttempt",
    "ReplayJob",
    "ReplayJobItem",
    "Role",
    "Status",
    "attach_died_again",
    "default_target_of",
    "mark_died_again",
    "has_role",
    "global_role_of",
    "glob_to_regex",
    "Membership",
    "MembershipRemoval",
    "Scope",
    "scope_of",
    "team_scoped",
    "Team",
    "TeamScope",
    "hash_token",
    "role_of",
    "set_role",
]
