"""/api/v1/ — one module per resource (recovery/api/<resource>.py)."""

from django.urls import path

from recovery.api import alerts, audits, broker, groups, messages, replay_jobs, teams, tokens

urlpatterns = [
    path("messages", messages.MessageList.as_view(), name="api-messages"),
    path("messages/discard", messages.discard_by_filter, name="api-messages-discard"),
    path("messages/restore", messages.restore_by_filter, name="api-messages-restore"),
    path("messages/<int:pk>", messages.MessageDetail.as_view(), name="api-message"),
    path("messages/<int:pk>/replay", messages.replay, name="api-message-replay"),
    path("messages/<int:pk>/discard", messages.discard, name="api-message-discard"),
    path("messages/<int:pk>/restore", messages.restore, name="api-message-restore"),
    path("replay-jobs", replay_jobs.ReplayJobs.as_view(), name="api-jobs"),
    path("replay-jobs/dry-run", replay_jobs.dry_run, name="api-jobs-dry-run"),
    path("replay-jobs/<int:pk>", replay_jobs.replay_job, name="api-job"),
    path("replay-jobs/<int:pk>/cancel", replay_jobs.cancel, name="api-job-cancel"),
    path("replay-jobs/<int:pk>/resume", replay_jobs.resume, name="api-job-resume"),
    path("groups", groups.GroupList.as_view(), name="api-groups"),
    path("stats", groups.stats, name="api-stats"),
    path("audits", audits.AuditRunList.as_view(), name="api-audits"),
    path("audits/<int:pk>", audits.AuditRunDetail.as_view(), name="api-audit"),
    path("audits/<int:pk>/evidence", audits.AuditEvidenceList.as_view(), name="api-evidence"),
    path("alert-rules", alerts.AlertRuleList.as_view(), name="api-alert-rules"),
    path("alert-rules/<int:pk>", alerts.AlertRuleDetail.as_view(), name="api-alert-rule"),
    path("alert-rules/<int:pk>/mute", alerts.mute_rule, name="api-alert-rule-mute"),
    path("alert-rules/<int:pk>/unmute", alerts.unmute_rule, name="api-alert-rule-unmute"),
    path("alert-channels", alerts.ChannelList.as_view(), name="api-alert-channels"),
    path("alert-channels/<int:pk>", alerts.ChannelDetail.as_view(), name="api-alert-channel"),
    path(
        "alert-channels/<int:pk>/rotate-secret",
        alerts.rotate_channel_secret,
        name="api-alert-channel-rotate",
    ),
    path("uncovered-queues", alerts.uncovered_queues, name="api-uncovered"),
    path("broker", broker.broker, name="api-broker"),
    path("tokens", tokens.TokenList.as_view(), name="api-tokens"),
    path("tokens/<int:pk>/revoke", tokens.revoke_token, name="api-token-revoke"),
    path("me", tokens.me, name="api-me"),
    path("teams", teams.TeamList.as_view(), name="api-teams"),
    path("teams/<int:pk>", teams.TeamDetail.as_view(), name="api-team"),
    path("team-scopes", teams.TeamScopeList.as_view(), name="api-team-scopes"),
    path("team-scopes/<int:pk>", teams.TeamScopeDetail.as_view(), name="api-team-scope"),
    path("team-memberships", teams.MembershipList.as_view(), name="api-memberships"),
    path("team-memberships/<int:pk>", teams.MembershipDetail.as_view(), name="api-membership"),
]
