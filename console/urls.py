from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from console.views import (
    activity,
    alerts,
    audits,
    broker,
    groups,
    health,
    jobs,
    message,
    messages,
    metrics,
    overview,
    teams,
    users,
)
from recovery.api.errors import api_not_found

urlpatterns = [
    path("", overview.overview, name="overview"),
    path("overview/live", overview.overview_live, name="overview-live"),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("messages/", messages.message_list, name="messages"),
    path("messages/bulk", messages.message_bulk, name="messages-bulk"),
    path(
        "messages/discard",
        messages.message_by_filter,
        {"action": "discard"},
        name="messages-discard-matching",
    ),
    path(
        "messages/restore",
        messages.message_by_filter,
        {"action": "restore"},
        name="messages-restore-matching",
    ),
    path("messages/<int:pk>/", message.message_detail, name="message"),
    path("messages/<int:pk>/replay", message.message_replay, name="message-replay"),
    path("messages/<int:pk>/discard", message.message_discard, name="message-discard"),
    path("messages/<int:pk>/restore", message.message_restore, name="message-restore"),
    path("messages/<int:pk>/edit", message.message_edit, name="message-edit"),
    path("messages/<int:pk>/body", message.message_body, name="message-body"),
    path("groups/", groups.group_list, name="groups"),
    path("jobs/", jobs.job_list, name="jobs"),
    path("jobs/new", jobs.job_new, name="job-new"),
    path("jobs/<int:pk>/", jobs.job_detail, name="job"),
    path("jobs/<int:pk>/cancel", jobs.job_cancel, name="job-cancel"),
    path("jobs/<int:pk>/resume", jobs.job_resume, name="job-resume"),
    path("activity/", activity.activity_list, name="activity"),
    path("users/", users.user_list, name="users"),
    path("users/<int:pk>/role", users.user_role, name="user-role"),
    path("users/<int:pk>/active", users.user_active, name="user-active"),
    path("users/unlock", users.user_unlock, name="user-unlock"),
    path("teams/", teams.team_list, name="teams"),
    path(
        "teams/<str:what>/<int:pk>/delete",
        teams.team_delete,
        name="team-delete",
    ),
    path("audits/", audits.audit_list, name="audits"),
    path("audits/<int:pk>/", audits.audit_detail, name="audit"),
    path("audits/<int:pk>/evidence", audits.audit_evidence, name="audit-evidence"),
    path("alerts/", alerts.alert_list, name="alerts"),
    path("alerts/<int:pk>/", alerts.alert_detail, name="alert"),
    path("alerts/<int:pk>/mute", alerts.alert_mute, name="alert-mute"),
    path("alerts/<int:pk>/delete", alerts.alert_delete, name="alert-delete"),
    path("alerts/channels/<int:pk>/test", alerts.channel_test, name="channel-test"),
    path(
        "alerts/channels/<int:pk>/rotate",
        alerts.channel_rotate_secret,
        name="channel-rotate",
    ),
    path(
        "alerts/channels/<int:pk>/disable",
        alerts.channel_set_enabled,
        {"enabled": False},
        name="channel-disable",
    ),
    path(
        "alerts/channels/<int:pk>/enable",
        alerts.channel_set_enabled,
        {"enabled": True},
        name="channel-enable",
    ),
    path("alerts/channels/<int:pk>/delete", alerts.channel_delete, name="channel-delete"),
    path("uncovered/", alerts.uncovered_list, name="uncovered"),
    path("broker/", broker.broker_page, name="broker"),
    path("metrics", metrics.metrics, name="metrics"),
    path("healthz", health.healthz, name="healthz"),
    path("livez", health.livez, name="livez"),
    path("readyz", health.readyz, name="readyz"),
    path("favicon.ico", health.favicon),
    path("admin/", admin.site.urls),
    path("api/v1/", include("recovery.api.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerSplitView.as_view(url_name="schema"), name="api-docs"),
    # Last: any other /api/ URL is a problem+json 404, with DEBUG on too.
    re_path(r"^api/(?P<path>.*)$", api_not_found),
]

# Under /api/ a missing URL or a crash answers problem+json like every other API error.
handler404 = "recovery.api.errors.handler404"
handler500 = "recovery.api.errors.handler500"
