"""The configured Prometheus (PROMETHEUS_* settings), or None when there is none."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from portal.lib.prometheus import Prometheus, parse_headers


def client() -> Prometheus | None:
    url = settings.PROMETHEUS_URL
    if not url:
        return None
    try:
        headers = parse_headers(settings.PROMETHEUS_HEADERS)
    except ValueError as exc:
        raise ImproperlyConfigured(f"PROMETHEUS_HEADERS: {exc}") from exc
    return Prometheus(
        url,
        settings.PROMETHEUS_TIMEOUT_S,
        bearer_token_file=settings.PROMETHEUS_BEARER_TOKEN_FILE,
        username=settings.PROMETHEUS_USERNAME,
        password=settings.PROMETHEUS_PASSWORD,
        ca_file=settings.PROMETHEUS_CA_FILE,
        headers=headers,
    )
