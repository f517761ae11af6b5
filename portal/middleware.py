"""Probe endpoints that answer whatever the Host header says.

Kubelet probes and Prometheus reach pods by IP; Django's host check would
answer 400 before the view runs. This sits first in MIDDLEWARE and serves
/healthz and /metrics itself; /metrics asks for a bearer token when
METRICS_TOKEN is set.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse


class ProbeMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.method not in ("GET", "HEAD"):
            return self.get_response(request)
        if request.path == "/healthz":
            return JsonResponse({"ok": True})
        if request.path == "/metrics":
            token = settings.METRICS_TOKEN
            auth = request.headers.get("Authorization", "")
            if token and not hmac.compare_digest(auth.encode(), f"Bearer {token}".encode()):
                return HttpResponse(
                    "metrics need a bearer token\n", status=401, content_type="text/plain"
                )
            from portal.metrics import metrics_response

            return metrics_response()
        return self.get_response(request)
