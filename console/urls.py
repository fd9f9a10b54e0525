from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from console import views

urlpatterns = [
    path("", RedirectView.as_view(pattern_name="messages", permanent=False)),
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("messages/", views.message_list, name="messages"),
    path("messages/<int:pk>/", views.message_detail, name="message"),
    path("messages/<int:pk>/replay", views.message_replay, name="message-replay"),
    path("healthz", views.healthz, name="healthz"),
    path("favicon.ico", views.favicon),
    path("admin/", admin.site.urls),
    path("api/v1/", include("recovery.api.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
]

# Under /api/ a missing URL or a crash answers problem+json like every other API error.
handler404 = "recovery.api.errors.handler404"
handler500 = "recovery.api.errors.handler500"
