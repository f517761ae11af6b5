from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from portal import metrics, views


portal_patterns = [
    path("", views.home, name="home"),
    path("requests/new/", views.request_submit, name="request-submit"),
    path("requests/<int:pk>/", views.request_detail, name="request-detail"),
    path("requests/<int:pk>/cancel/", views.request_cancel, name="request-cancel"),
]

urlpatterns = [
    path("", include((portal_patterns, "portal"))),
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("healthz", views.healthz, name="healthz"),
    path("metrics", metrics.metrics_view, name="metrics"),
]
