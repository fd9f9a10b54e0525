from django.urls import path

from recovery.api import views

urlpatterns = [
    path("messages", views.MessageList.as_view(), name="api-messages"),
    path("messages/<int:pk>", views.MessageDetail.as_view(), name="api-message"),
    path("messages/<int:pk>/replay", views.replay, name="api-message-replay"),
]
